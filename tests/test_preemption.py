"""The stop signal watcher: a first SIGINT asks for a save, a second one stops at once."""

import signal
import textwrap

import pytest

from tests.conftest import run_py

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from tfdist.preemption import PreemptionWatcher
    w = PreemptionWatcher()
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGINT)   # the same Ctrl-C forwarded by a launcher: no effect
    time.sleep(0.1)
    print("requested", w.requested, "interrupted", w.interrupted, flush=True)
    time.sleep(float(sys.argv[1]))
    os.kill(os.getpid(), signal.SIGINT)   # Ctrl-C again
    time.sleep(5)
    print("still running", flush=True)
""")


@pytest.mark.integration
def test_second_interrupt_stops_at_once_but_a_duplicate_does_not():
    proc = run_py(["-c", SCRIPT, "0.6"], timeout=30)
    assert "requested True interrupted True" in proc.stdout
    assert proc.returncode == 130 and "still running" not in proc.stdout
    assert proc.stderr.strip() == "tfdist: second interrupt: stopping now, without saving."


def test_sigterm_is_a_preemption_not_an_interrupt():
    from tfdist.preemption import PreemptionWatcher

    w = PreemptionWatcher()
    try:
        signal.raise_signal(signal.SIGTERM)
        assert w.requested and w.signum == signal.SIGTERM and not w.interrupted
    finally:
        w.uninstall()


CATCH_SCRIPT = textwrap.dedent("""
    import os, signal, time
    from tfdist import preemption
    w = preemption.catch_signals()   # first, before any other thread
    swallowed = []
    signal.signal(signal.SIGTERM, lambda *a: swallowed.append(a))  # as TensorFlow's C++ one would
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + 10
    while not w.requested and time.monotonic() < deadline:
        time.sleep(0.01)
    print("requested", w.requested, w.signum == signal.SIGTERM, "swallowed", bool(swallowed))
    w.uninstall()
    print("blocked after", signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, []),
          preemption.current())
""")


@pytest.mark.integration
def test_caught_signals_are_recorded_whatever_handler_is_installed_later():
    # Issue 48: a SIGTERM before the trainer's handler (TensorFlow's start-up), or
    # while TensorFlow's C++ SigtermNotifier had replaced it, was fatal or lost.
    # Blocked and taken by sigtimedwait, it is recorded even when a handler that
    # would swallow it is installed meanwhile; uninstall gives the signals back.
    proc = run_py(["-c", CATCH_SCRIPT], timeout=60)
    assert "requested True True swallowed False" in proc.stdout, proc.stdout + proc.stderr
    assert "blocked after False None" in proc.stdout


def test_catch_signals_blocks_both_in_the_main_thread_until_uninstalled():
    from tfdist import preemption

    watcher = preemption.catch_signals()
    try:
        assert preemption.current() is watcher
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        assert {signal.SIGTERM, signal.SIGINT} <= blocked
    finally:
        watcher.uninstall()
    assert preemption.current() is None
    assert not {signal.SIGTERM, signal.SIGINT} & signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_a_siginfo_naming_no_signal_of_the_set_is_not_a_stop(monkeypatch):
    import time

    from tfdist import preemption

    class Garbage:
        si_signo = 1205072368  # what one Slurm rank reported after its last step

    given = []

    def sigtimedwait(signals, timeout):
        if not given:
            given.append(True)
            return Garbage()
        time.sleep(timeout)
        return None

    monkeypatch.setattr(preemption.signal, "sigtimedwait", sigtimedwait)
    watcher = preemption.catch_signals()
    try:
        deadline = time.monotonic() + 5
        while not given and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        assert given and not watcher.requested and watcher.signum is None
    finally:
        watcher.uninstall()


@pytest.mark.integration
@pytest.mark.parametrize("name, after", [("SIGTERM", "start"), ("SIGINT", "last epoch")])
def test_a_signal_at_start_up_or_at_the_final_save_ends_in_its_status(tmp_path, name, after):
    """Issue 48's failing windows: before the trainer's handler, and after its last step."""
    import os
    import subprocess
    import sys
    import time

    from tests.conftest import REPO, clean_env

    model_dir, status = str(tmp_path / "m"), str(tmp_path / "status")
    epochs = "30" if after == "start" else "1"
    cmd = [sys.executable, "-m", "tfdist.train", "digits_mlp", "--epochs", epochs,
           "--model-dir", model_dir, "--status-file", status, "--verbose", "2"]
    want = 75 if name == "SIGTERM" else 130
    proc = subprocess.Popen(cmd, cwd=REPO, env=clean_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if after == "start":
        time.sleep(0.3)  # Python is importing tfdist (TensorFlow comes later)
    else:
        for line in proc.stdout:  # Keras prints the epoch's line at its end: eval and save next
            if line.startswith("22/22"):
                break
    proc.send_signal(getattr(signal, name))
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == want, out[-3000:]
    assert open(status).read() == f"{want}\n"
    assert "Traceback" not in out and "terminate called" not in out
    assert os.listdir(os.path.join(model_dir, "backup")), out[-3000:]
    if after == "start":
        assert "preempted by signal 15 at global step 1;" in out
    else:
        assert "interrupted after the last step: the run finished" in out
    rerun = subprocess.run(cmd, cwd=REPO, env=clean_env(), text=True, capture_output=True,
                           timeout=120)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert os.path.exists(os.path.join(model_dir, "model.keras"))
