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
