"""Real processes: one job per model dir, storage checked up front (issue 19).

Each test starts real `python -m tfdist.train` / `tfdist.launch` processes and
asserts what an operator would see: who holds a dir, which path failed, which
processes are left.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

from tests.conftest import REPO, WORKERS, clean_env, run_py, tail, wait_for_checkpoint
from tfdist import exit_codes

pytestmark = pytest.mark.integration

SLOW = os.path.join(WORKERS, "slow_digits.py")


def _need_root(what: str) -> None:
    if os.geteuid() != 0:
        reason = f"{what} needs root (mount)"
        if os.environ.get("CI"):
            pytest.fail(f"CI runs as root: {reason}")
        pytest.skip(reason)


def test_second_job_on_a_locked_dir_is_refused_and_the_first_keeps_its_own(tmp_path):
    model_dir = str(tmp_path / "m")
    first = subprocess.Popen(
        [sys.executable, "-m", "tfdist.train", SLOW, "--model-dir", model_dir, "--epochs", "3",
         "--learning-rate", "0.1", "--verbose", "0", "--threads", "1"],
        cwd=REPO, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = first.stdout.readline()
        while line and "recipe=" not in line:  # logged once the chief holds the dir
            line = first.stdout.readline()
        assert line, first.stderr.read()[-3000:]
        started = time.monotonic()
        second = run_py(["-m", "tfdist.train", SLOW, "--model-dir", model_dir, "--epochs", "1",
                         "--learning-rate", "0.05", "--verbose", "0"], timeout=60)
        refused_in = time.monotonic() - started
        assert first.poll() is None, "the first job must still be running"
        out, err = first.communicate(timeout=240)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert second.returncode == exit_codes.CONFIG, tail(second)
    assert f"model dir {model_dir} is in use by another tfdist job (host " in second.stderr
    assert f"pid {first.pid}, started 20" in second.stderr
    assert refused_in < 30  # before TensorFlow starts (seconds; generous for a busy machine)
    assert first.returncode == 0, err[-3000:]
    metrics = json.load(open(os.path.join(model_dir, "metrics.json")))
    assert metrics["learning_rate"] == 0.1 and metrics["epochs"] == 3
    assert sorted(os.listdir(os.path.join(model_dir, "backup"))) == [
        f"ckpt-{s:010d}.npz" for s in (22, 44, 66)]


@contextlib.contextmanager
def _mounted(*args):
    point = tempfile.mkdtemp(prefix="tfdist_mnt_")
    subprocess.run(["mount", *args, point], check=True, capture_output=True)
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
        os.rmdir(point)


def test_full_disk_fails_before_training_naming_the_path(tmp_path):
    _need_root("a 1 MB tmpfs")
    with _mounted("-t", "tmpfs", "-o", "size=1m", "tmpfs") as point:
        model_dir = os.path.join(point, "m")
        proc = run_py(["-m", "tfdist.train", "wide_mlp", "--model-dir", model_dir,
                       "--epochs", "1", "--verbose", "0", "--steps-per-epoch", "2"])
        assert proc.returncode == exit_codes.CONFIG, tail(proc)
        assert f"error: cannot write backups to {model_dir}: [Errno 28] ENOSPC" in proc.stderr
        assert "Traceback" not in proc.stderr
        # Nothing half-written, and no empty backup/ that looks like a run: the dirs
        # this run created are removed with the refusal (model_dir.claim).
        assert os.listdir(point) == [], os.listdir(point)


def test_read_only_dir_fails_before_tensorflow_naming_the_path(tmp_path):
    _need_root("a read-only bind mount")
    source = tmp_path / "src"
    (source / "m").mkdir(parents=True)
    with _mounted("--bind", "-o", "ro", str(source)) as point:
        # A bind mount is writable until remounted read-only.
        subprocess.run(["mount", "-o", "remount,bind,ro", point], check=True)
        model_dir = os.path.join(point, "m")
        started = time.monotonic()
        proc = run_py(["-m", "tfdist.train", "digits_mlp", "--model-dir", model_dir,
                       "--epochs", "1", "--verbose", "0"])
        took = time.monotonic() - started
        assert proc.returncode == exit_codes.CONFIG, tail(proc)
        assert (f"error: the model dir is not writable: {model_dir}/backup: [Errno 30] EROFS"
                in proc.stderr), tail(proc)
        assert "Traceback" not in proc.stderr and "recipe=" not in proc.stdout
        assert took < 30  # no TensorFlow was started


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _shm_job(model_dir: str, *launch_args) -> list[str]:
    return [sys.executable, "-m", "tfdist.launch", "-n", "2", *launch_args, "--",
            sys.executable, "-m", "tfdist.train", SLOW, "--strategy", "shm",
            "--example-delay-ms", "3", "--epochs", "2", "--save-every-steps", "4",
            "--verbose", "0", "--threads", "1", "--model-dir", model_dir]


def test_sigkilled_launcher_leaves_no_worker_and_the_rerun_takes_over(tmp_path):
    model_dir = str(tmp_path / "m")
    command = _shm_job(model_dir)
    launcher = subprocess.Popen(command, cwd=REPO, env=clean_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        wait_for_checkpoint(model_dir, lambda: launcher.poll() is None, 180)
        workers = _children(launcher.pid)
        assert len(workers) == 2
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [p for p in workers if _alive(p)]
    finally:
        for p in _children(launcher.pid) + workers:
            with contextlib.suppress(OSError):
                os.kill(p, 9)
    assert not left, f"workers {left} outlived their launcher by 5 s"
    lock = json.load(open(os.path.join(model_dir, ".tfdist.lock")))
    assert lock["pid"] in workers  # the killed chief's record is still there

    rerun = subprocess.run(command, cwd=REPO, env=clean_env(), capture_output=True, text=True,
                           timeout=240)
    assert rerun.returncode == 0, tail(rerun)
    assert (f"[worker 0] tfdist: took over the lock of a job that is no longer running "
            f"(host {lock['host']}, pid {lock['pid']}") in rerun.stdout
    assert "[worker 0] tfdist: resumed from" in rerun.stdout
    for d in (model_dir, os.path.join(model_dir, "backup")):
        assert not [f for f in os.listdir(d) if ".tmp" in f]
    assert not [f for f in os.listdir("/dev/shm") if f.startswith("tfdist_")
                and int(f.split("_")[1]) in workers]


def test_sigint_is_not_restarted_even_when_the_launcher_ignored_it(tmp_path):
    import signal

    model_dir = str(tmp_path / "m")
    # As `cmd &` in a script starts it: SIGINT ignored, inherited by what it runs.
    launcher = subprocess.Popen(
        _shm_job(model_dir, "--max-restarts", "2"), cwd=REPO, env=clean_env(), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        wait_for_checkpoint(model_dir, lambda: launcher.poll() is None, 180)
        workers = _children(launcher.pid)
        launcher.send_signal(signal.SIGINT)
        out, err = launcher.communicate(timeout=90)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 130, err[-3000:]
    assert "tfdist.launch: stopped by SIGINT; not restarting." in err
    assert "restarting all" not in err and "metrics.json" not in os.listdir(model_dir)
    assert not [p for p in workers if _alive(p)]


def test_corrupt_newest_backup_falls_back_and_a_new_epoch_length_is_refused_not_hung(tmp_path):
    model_dir = str(tmp_path / "m")
    base = ["-m", "tfdist.train", "digits_mlp", "--model-dir", model_dir, "--verbose", "0",
            "--threads", "1", "--save-every-steps", "15"]
    first = run_py([*base, "--epochs", "1", "--steps-per-epoch", "20"])
    assert first.returncode == 0, tail(first)
    backup = os.path.join(model_dir, "backup")
    newest, older = (os.path.join(backup, f"ckpt-{s:010d}.npz") for s in (20, 15))
    with open(newest, "r+b") as f:
        f.truncate(1000)

    # The newest good backup is mid-epoch (step 15 of 20): another epoch length is refused.
    changed = run_py([*base, "--epochs", "2", "--steps-per-epoch", "10"])
    assert changed.returncode == exit_codes.CONFIG, tail(changed)
    assert f"tfdist: skipped backup {newest}, moved aside to {newest}.corrupt: Backup " \
           f"{newest} is corrupt or truncated" in changed.stdout
    assert (f"Backup {older} cannot be resumed: it was taken at step 15 of an epoch of 20 "
            "steps (steps_per_epoch=20), but this run has steps_per_epoch=10") in changed.stderr
    assert sorted(os.listdir(backup)) == ["ckpt-0000000015.npz", "ckpt-0000000020.npz.corrupt"]

    same = run_py([*base, "--epochs", "2", "--steps-per-epoch", "20"])
    assert same.returncode == 0, tail(same)
    assert f"resumed from {older}: epoch 0, step 15 of 20 (global step 15)" in same.stdout
    metrics = json.load(open(os.path.join(model_dir, "metrics.json")))
    assert metrics["global_step"] == 40 and len(metrics["history"]["loss"]) == 2
    assert os.path.exists(newest + ".corrupt")  # moved aside, never deleted


def test_busy_port_without_launcher_ends_every_worker_within_the_startup_timeout(tmp_path):
    import signal
    import socket

    from tfdist.launch import free_ports, worker_tf_configs

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen(16)  # accepts connections, never answers: a foreign program
    ports = [squatter.getsockname()[1], *free_ports(3)]
    # Worker 0's port is busy; a lone worker of another job waits for a leader
    # that never starts (ports[2], nothing listens) and is stopped with SIGTERM.
    configs = [*worker_tf_configs(ports[:2]), worker_tf_configs([ports[2], ports[3]])[1]]
    procs = []
    try:
        for i, cfg in enumerate(configs):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "tfdist.train", "digits_mlp", "--strategy",
                 "multi_worker", "--startup-timeout-s", "10", "--epochs", "1", "--verbose", "0",
                 "--model-dir", str(tmp_path / f"m{min(i, 2)}")],
                cwd=REPO, env=clean_env(TF_CONFIG=json.dumps(cfg)), text=True,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        w0, w1, lone = procs
        _, err0 = w0.communicate(timeout=120)
        line = w1.stdout.readline()
        while line and "waiting up to 10 s" not in line:
            line = w1.stdout.readline()
        assert line, w1.stderr.read()[-3000:]
        w1_waiting = time.monotonic()
        line = lone.stdout.readline()
        while line and "waiting up to 10 s" not in line:
            line = lone.stdout.readline()
        assert line, lone.stderr.read()[-3000:]
        lone.send_signal(signal.SIGTERM)
        _, lone_err = lone.communicate(timeout=10)  # at once: it waits in Python, not in TF
        _, err1 = w1.communicate(timeout=120)
        w1_took = time.monotonic() - w1_waiting
    finally:
        squatter.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    address = f"127.0.0.1:{ports[0]}"
    assert w0.returncode == exit_codes.CLUSTER, err0[-3000:]
    assert f"error: worker 0 cannot listen on {address}: the port is in use" in err0
    assert "HINT: " in err0 and "Traceback" not in err0
    assert lone.returncode == exit_codes.PREEMPTED, lone_err[-3000:]
    assert (f"tfdist: preempted by signal {int(signal.SIGTERM)} while waiting for worker 0 "
            f"(127.0.0.1:{ports[2]}) to start: no step trained, nothing saved") in lone_err
    assert w1.returncode == exit_codes.PEER_LOST, err1[-3000:]
    assert f"the coordination service at {address} within --startup-timeout-s 10" in err1
    assert "Traceback" not in err1
    assert w1_took < 10 * 3  # the start-up timeout, generously (a busy machine)


def test_worker_whose_leader_never_starts_ends_naming_it():
    from tfdist.errors import PeerLostError
    from tfdist.launch import free_ports, worker_tf_configs
    from tfdist.cluster import detect
    from tfdist.strategies.multi_worker import wait_for_leader

    cfg = worker_tf_configs(free_ports(2))[1]
    info = detect({"TF_CONFIG": json.dumps(cfg)})
    started = time.monotonic()
    with pytest.raises(PeerLostError, match=rf"worker 0 \({cfg['cluster']['worker'][0]}\) "
                                            "did not start within --startup-timeout-s 1"):
        wait_for_leader(info, 1.0)
    assert time.monotonic() - started < 10


def test_ps_servers_exit_when_their_chief_dies_just_after_opening_its_port(tmp_path):
    import signal

    from tfdist.launch import free_ports, ps_tf_configs
    from tfdist.ps import reachable

    tasks = ps_tf_configs(1, 1, free_ports(3))
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tfdist.train", "digits_mlp", "--strategy", "parameter_server",
         "--model-dir", str(tmp_path / "m"), "--verbose", "0"],
        cwd=REPO, env=clean_env(TF_CONFIG=json.dumps(cfg)), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _, cfg in tasks]
    chief, servers = procs[0], procs[1:]
    chief_address = tasks[0][1]["cluster"]["chief"][0]
    try:
        deadline = time.monotonic() + 120
        while not reachable(chief_address, 0.2):
            assert time.monotonic() < deadline and chief.poll() is None, chief.stdout.read()
            time.sleep(0.02)
        chief.send_signal(signal.SIGKILL)  # as soon as its port is open
        killed = time.monotonic()
        outs = [p.communicate(timeout=60)[0] for p in servers]
        took = time.monotonic() - killed
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert took < 30, took
    for (label, _), p, out in zip(tasks[1:], servers, outs):
        assert p.returncode == 0, out[-3000:]
        assert f"tfdist: {label}: the chief at {chief_address} " in out
        assert "this task has nothing left to serve and exits" in out
