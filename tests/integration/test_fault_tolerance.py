"""Real processes: a killed worker, a restart, a preemption, a bad backup.

Every run trains digits_mlp for 4 epochs (22 steps each) of plain SGD at global
batch 64 on 2 MWMS workers with deterministic ops, backing up every 4 steps.
Whatever happens in between, the final weights must equal those of one
uninterrupted run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import REPO, WORKERS, clean_env, run_py, tail, wait_for_checkpoint
from tests.weights import dump_dir_weights as _weights
from tfdist import exit_codes
from tfdist.launch import free_ports, worker_tf_configs

pytestmark = pytest.mark.integration

DUMP = os.path.join(WORKERS, "train_dump.py")
ARGS = ["digits_mlp", "--epochs", "4", "--seed", "0",
        "--deterministic", "--global-batch-size", "64", "--learning-rate", "0.1",
        "--verbose", "0", "--threads", "1", "--save-every-steps", "4"]
CHIEF_FILES = [".tfdist.lock", "backup", "history.csv", "metrics.json", "model.keras"]


def _assert_equal_to(baseline, dump_dir):
    got = _weights(dump_dir)
    assert len(got) == 2
    for worker in got:
        for a, b in zip(worker, baseline):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _launch(dump_dir, model_dir, faults=(), strategy="multi_worker", max_restarts=0):
    return run_py(["-m", "tfdist.launch", "-n", "2", "--timeout", "240", "--max-restarts",
                   str(max_restarts), "--", sys.executable, DUMP, dump_dir, *faults, *ARGS,
                   "--strategy", strategy, "--model-dir", model_dir])


def _start_workers(dump_dir, model_dir, faults=(), strategy="multi_worker"):
    """Two workers started by hand (no launcher supervising them)."""
    procs = []
    args = [*ARGS, "--strategy", strategy]
    for cfg in worker_tf_configs(free_ports(2)):
        procs.append(subprocess.Popen(
            [sys.executable, DUMP, dump_dir, *faults, *args, "--model-dir", model_dir],
            env=clean_env(TF_CONFIG=json.dumps(cfg)), cwd=REPO, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    return procs


def uninterrupted(tmp):
    """2 MWMS workers, no fault: (each worker's weights, the model dir). Also
    test_parameter_server's synchronous run (trained once, tests/integration/conftest.py)."""
    dump, model_dir = os.path.join(tmp, "dump"), os.path.join(tmp, "model")
    proc = _launch(dump, model_dir)
    assert proc.returncode == 0, tail(proc)
    return _weights(dump), model_dir


@pytest.fixture(scope="module")
def baseline(shared_run):
    (w0, w1), model_dir = shared_run(uninterrupted)
    for a, b in zip(w0, w1):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    return w0, model_dir


@pytest.mark.parametrize("strategy", ["multi_worker", "shm"])
def test_killed_worker_ends_the_job_quickly_and_rerun_resumes(baseline, tmp_path, strategy):
    weights, _ = baseline
    model_dir, dump = str(tmp_path / "model"), str(tmp_path / "dump")
    faults = ["--kill-worker", "1", "--kill-at-step", "30", "--marker", str(tmp_path / "killed")]
    chief, worker = _start_workers(dump, model_dir, faults, strategy)
    try:
        _, err1 = worker.communicate(timeout=180)
        killed_at = time.monotonic()
        assert worker.returncode == -signal.SIGKILL, err1[-2000:]
        _, err0 = chief.communicate(timeout=90)
        waited = time.monotonic() - killed_at
    finally:
        for p in (chief, worker):
            p.kill() if p.poll() is None else None
    assert chief.returncode == exit_codes.PEER_LOST, err0[-3000:]
    assert waited < 60
    assert "lost contact with worker 1 (127.0.0.1:" in err0
    assert "rerun the same command to resume" in err0
    # Step 30 is in epoch 2 (steps 23-44); the newest backup is from step 28.
    assert os.path.basename(sorted(os.listdir(os.path.join(model_dir, "backup")))[-1]) == (
        "ckpt-0000000028.npz")

    chief, worker = _start_workers(dump, model_dir, faults, strategy)  # the same command again
    out0, err0 = chief.communicate(timeout=240)
    worker.communicate(timeout=60)
    assert chief.returncode == 0 and worker.returncode == 0, err0[-3000:]
    assert "resumed from" in out0 and "epoch 1, step 6 of 22 (global step 28)" in out0
    _assert_equal_to(weights, dump)
    assert sorted(os.listdir(model_dir)) == CHIEF_FILES


def test_launcher_restarts_and_resumes_without_manual_rerun(baseline, tmp_path):
    weights, _ = baseline
    model_dir, dump = str(tmp_path / "model"), str(tmp_path / "dump")
    faults = ["--kill-worker", "1", "--kill-at-step", "30", "--marker", str(tmp_path / "killed")]
    proc = _launch(dump, model_dir, faults, max_restarts=1)
    assert proc.returncode == 0, tail(proc)
    assert "worker 1 failed (killed by SIGKILL)" in proc.stderr
    assert "restarting all 2 worker(s) (restart 1 of 1)" in proc.stderr
    assert "[worker 0] tfdist: resumed from" in proc.stdout
    _assert_equal_to(weights, dump)
    metrics = json.load(open(os.path.join(model_dir, "metrics.json")))
    assert metrics["global_step"] == 88 and len(metrics["history"]["loss"]) == 4


@pytest.mark.parametrize("strategy", ["multi_worker", "shm"])
def test_sigterm_to_chief_saves_backup_and_exits_distinctly(baseline, tmp_path, strategy):
    weights, _ = baseline
    model_dir, dump = str(tmp_path / "model"), str(tmp_path / "dump")
    chief, worker = _start_workers(dump, model_dir, ["--step-delay-ms", "40"], strategy)
    backup_dir = os.path.join(model_dir, "backup")
    try:
        wait_for_checkpoint(model_dir, lambda: chief.poll() is None, 120, "the chief")
        chief.send_signal(signal.SIGTERM)
        _, err0 = chief.communicate(timeout=60)
        _, err1 = worker.communicate(timeout=60)
    finally:
        for p in (chief, worker):
            p.kill() if p.poll() is None else None
    assert chief.returncode == exit_codes.PREEMPTED, err0[-3000:]
    assert worker.returncode == exit_codes.PREEMPTED, err1[-3000:]
    assert "preempted by signal 15 at global step" in err0
    step = int(err0.split("at global step ")[1].split(";")[0])
    newest = sorted(os.listdir(backup_dir))[-1]
    assert newest == f"ckpt-{step:010d}.npz" and 0 < step < 88
    assert step % 20 == 0  # 2 processes agree every 20 steps (preemption.default_check_steps)
    assert "metrics.json" not in os.listdir(model_dir)

    proc = _launch(dump, model_dir, strategy=strategy)  # requeue: the same command
    assert proc.returncode == 0, tail(proc)
    assert f"(global step {step})" in proc.stdout
    _assert_equal_to(weights, dump)


def test_backup_from_other_run_is_refused(baseline, tmp_path):
    _, model_dir = baseline
    copy = str(tmp_path / "copy")
    shutil.copytree(model_dir, copy)
    proc = run_py(["-m", "tfdist.train", "synthetic_cnn", "--model-dir", copy, "--epochs", "1"])
    assert proc.returncode == exit_codes.CONFIG, tail(proc)
    assert "cannot be resumed: it was written with recipe='digits_mlp' but this run has " \
           "recipe='synthetic_cnn'" in proc.stderr
    # Another replica count resumes (tests/integration/test_elastic.py); another batch does not.
    proc = run_py(["-m", "tfdist.train", "digits_mlp", "--model-dir", copy, "--epochs", "5",
                   "--global-batch-size", "32"])
    assert proc.returncode == exit_codes.CONFIG, tail(proc)
    assert "--global-batch-size 64 there, 32 here" in proc.stderr
    assert "per_replica_batch_size" not in proc.stdout  # refused before TensorFlow started


def test_truncated_backup_is_a_clear_error_and_no_resume_starts_fresh(tmp_path):
    model_dir = str(tmp_path / "m")
    base = ["-m", "tfdist.train", "digits_mlp", "--model-dir", model_dir, "--verbose", "0"]
    proc = run_py([*base, "--epochs", "1"])
    assert proc.returncode == 0, tail(proc)
    path = os.path.join(model_dir, "backup", "ckpt-0000000022.npz")
    data = open(path, "rb").read()
    open(path, "wb").write(data[:1000])
    proc = run_py([*base, "--epochs", "2"])
    assert proc.returncode == exit_codes.CONFIG
    assert f"Backup {path} is corrupt or truncated" in proc.stderr
    proc = run_py([*base, "--epochs", "1", "--no-resume"])
    assert proc.returncode == 0, tail(proc)
    assert "--no-resume: removed old backups" in proc.stdout
    assert os.listdir(os.path.join(model_dir, "backup")) == ["ckpt-0000000022.npz"]
