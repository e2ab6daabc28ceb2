"""Real processes: a backup resumes on another replica count or data-parallel strategy.

Every run trains digits_mlp for 4 epochs (14 steps each) of plain SGD at global
batch 96 with deterministic ops, backing up every 4 steps. Whatever ran the
first part (2 MWMS workers, 2 shm ranks, 2 Horovod ranks) and whatever resumes
it (1 process, 3 workers, ...), the final weights must equal those of one
uninterrupted single-replica run: every global batch holds the same examples
whatever the number of replicas. A changed global batch is refused unless
--rescale-lr-on-batch-change is given (then the math differs, by design).
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np
import pytest

from tests.conftest import WORKERS, run_py, run_py_many, tail
from tests.integration.slurm_util import keras_weights
from tests.integration.test_horovod import VENV, horovodrun
from tests.weights import dump_dir_weights as _weights
from tfdist import exit_codes

pytestmark = pytest.mark.integration

DUMP = os.path.join(WORKERS, "train_dump.py")
COMMON = ["digits_mlp", "--seed", "0", "--deterministic", "--global-batch-size", "96",
          "--learning-rate", "0.1", "--verbose", "0", "--threads", "1",
          "--save-every-steps", "4"]
# Worker 1 dies after its 22nd step: epoch 1, step 8 of 14; the newest backup is step 20.
KILL = ["--kill-worker", "1", "--kill-at-step", "22"]


def _assert_equal(baseline, dump_dir, workers):
    got = _weights(dump_dir)
    assert len(got) == workers
    for weights in got:
        assert len(weights) == len(baseline) == 4
        for a, b in zip(weights, baseline):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _run(n, dump, model_dir, strategy, epochs=4, faults=()):
    """`n` workers under tfdist.launch (n=1: one plain process)."""
    return run_py(_command(n, dump, model_dir, strategy, epochs, faults))


def _command(n, dump, model_dir, strategy, epochs=4, faults=()):
    args = [DUMP, dump, *faults, *COMMON, "--epochs", str(epochs), "--strategy", strategy,
            "--model-dir", model_dir]
    if n == 1:
        return args
    return ["-m", "tfdist.launch", "-n", str(n), "--timeout", "240", "--", sys.executable, *args]


def uninterrupted_single(tmp):
    """One replica, 4 uninterrupted epochs: the weights every resume must end with; also
    test_host_faults' reference (trained once, tests/integration/conftest.py)."""
    proc = _run(1, os.path.join(tmp, "dump"), os.path.join(tmp, "model"), "single")
    assert proc.returncode == 0, tail(proc)
    return _weights(os.path.join(tmp, "dump"))[0]


@pytest.fixture(scope="module")
def baseline(shared_run):
    return shared_run(uninterrupted_single)


def _killed(tmp_path, strategy):
    """A model dir left by 2 `strategy` workers killed mid-epoch."""
    model_dir = str(tmp_path / f"killed-{strategy}")
    proc = _run(2, str(tmp_path / "unused"), model_dir, strategy,
                faults=[*KILL, "--marker", str(tmp_path / f"marker-{strategy}")])
    assert "FAULT: worker 1 SIGKILLs itself" in proc.stdout, tail(proc)
    # A lost worker is exit 4 from the launcher too, whoever it saw end first.
    assert proc.returncode == exit_codes.PEER_LOST, tail(proc)
    assert sorted(os.listdir(os.path.join(model_dir, "backup")))[-1] == "ckpt-0000000020.npz"
    return model_dir


@pytest.fixture(scope="module")
def killed_multi_worker(tmp_path_factory):
    """A model dir left by 2 MWMS workers killed mid-epoch; each test resumes copies of it."""
    return _killed(tmp_path_factory.mktemp("killed"), "multi_worker")


def _copy(model_dir, tmp_path, name):
    shutil.copytree(model_dir, str(tmp_path / name))
    return str(tmp_path / name)


def test_two_workers_killed_mid_epoch_resume_on_one_on_three_and_on_three_devices(
        baseline, killed_multi_worker, tmp_path):
    model_dir, three, devices = (_copy(killed_multi_worker, tmp_path, name)
                                 for name in ("one", "three", "devices"))
    # The three resumes, each from its own copy, two at a time (one thread per process).
    one_proc, three_proc, devices_proc = run_py_many([
        _command(1, str(tmp_path / "dump1"), model_dir, "single"),
        _command(3, str(tmp_path / "dump3"), three, "multi_worker"),
        # One process, 3 replicas: MirroredStrategy over 3 logical CPU devices.
        [DUMP, str(tmp_path / "dump-dev"), *COMMON, "--epochs", "4", "--strategy",
         "mirrored", "--devices", "3", "--model-dir", devices]], timeout=240)

    proc = one_proc
    assert proc.returncode == 0, tail(proc)
    assert "epoch 1, step 6 of 14 (global step 20)" in proc.stdout, tail(proc)
    assert "resumed from a 2-replica multi_worker backup on 1 replica (single)" in proc.stdout
    _assert_equal(baseline, str(tmp_path / "dump1"), 1)

    proc = three_proc
    assert proc.returncode == 0, tail(proc)
    assert "resumed from a 2-replica multi_worker backup on 3 replicas (multi_worker)" in (
        proc.stdout), tail(proc)
    _assert_equal(baseline, str(tmp_path / "dump3"), 3)

    proc = devices_proc
    assert proc.returncode == 0, tail(proc)
    assert "resumed from a 2-replica multi_worker backup on 3 replicas (mirrored)" in (
        proc.stdout), tail(proc)
    assert "per_replica_batch_size=32" in proc.stdout
    _assert_equal(baseline, str(tmp_path / "dump-dev"), 1)


def test_shm_backup_resumes_under_single(baseline, tmp_path):
    model_dir = _killed(tmp_path, "shm")
    proc = _run(1, str(tmp_path / "dump"), model_dir, "single")
    assert proc.returncode == 0, tail(proc)
    assert "resumed from a 2-replica shm backup on 1 replica (single)" in proc.stdout, tail(proc)
    _assert_equal(baseline, str(tmp_path / "dump"), 1)


@pytest.fixture(scope="module")
def venv():
    if not os.access(os.path.join(VENV, "bin", "horovodrun"), os.X_OK):
        reason = f"no Horovod venv at {VENV} (TFDIST_HOROVOD_VENV): run scripts/install_horovod.sh"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Horovod tests, but {reason}")
        pytest.skip(reason)
    return VENV


def _horovod(venv, dump, model_dir, epochs, ranks=2):
    """`ranks` Horovod ranks (Gloo) in the Horovod venv (TensorFlow 2.18)."""
    return horovodrun(venv, ranks, "gloo", [
        os.path.join(WORKERS, "hvd_train_dump.py"), dump, *COMMON, "--epochs", str(epochs),
        "--strategy", "horovod", "--model-dir", model_dir])


def test_horovod_backup_resumes_under_multi_worker_and_back(venv, baseline, killed_multi_worker,
                                                            tmp_path):
    # Horovod's first 2 epochs, then 2 MWMS workers (another TensorFlow) the last 2.
    model_dir = str(tmp_path / "hvd-first")
    proc = _horovod(venv, str(tmp_path / "unused"), model_dir, epochs=2)
    assert proc.returncode == 0, tail(proc)
    proc = _run(2, str(tmp_path / "dump-mw"), model_dir, "multi_worker")
    assert proc.returncode == 0, tail(proc)
    assert "resumed from a 2-replica horovod backup on 2 replicas (multi_worker)" in (
        proc.stdout), tail(proc)
    _assert_equal(baseline, str(tmp_path / "dump-mw"), 2)

    # And the reverse on 4 ranks: 2 MWMS workers' first 20 steps (killed mid-epoch), 4
    # Horovod ranks' remaining 36.
    model_dir = _copy(killed_multi_worker, tmp_path, "mw-first")
    proc = _horovod(venv, str(tmp_path / "dump-hvd"), model_dir, epochs=4, ranks=4)
    assert proc.returncode == 0, tail(proc)
    assert "resumed from a 2-replica multi_worker backup on 4 replicas (horovod)" in (
        proc.stdout), tail(proc)
    _assert_equal(baseline, str(tmp_path / "dump-hvd"), 4)


def test_launcher_goes_on_with_the_survivors_when_a_worker_cannot_come_back(baseline, tmp_path):
    # Worker 2 dies at its 22nd step, then fails at every start: its host is gone.
    model_dir, dump = str(tmp_path / "model"), str(tmp_path / "dump")
    proc = run_py(["-m", "tfdist.launch", "-n", "3", "--max-restarts", "2", "--min-workers", "2",
                   "--timeout", "400", "--", sys.executable, DUMP, dump, "--kill-worker", "2",
                   "--kill-at-step", "22", "--fail-start-worker", "2", "--marker",
                   str(tmp_path / "marker"), *COMMON, "--epochs", "4",
                   "--strategy", "multi_worker", "--model-dir", model_dir], timeout=450)
    assert proc.returncode == 0, tail(proc)
    assert "worker 2 failed (killed by SIGKILL)" in proc.stderr, tail(proc)
    assert proc.stderr.count("FAULT: worker 2 cannot start") == 2
    assert ("worker 2 did not come back (exit code 1 after 2 restart(s)); relaunching with the "
            "2 surviving worker(s) (--min-workers 2)") in proc.stderr
    assert "resumed from a 3-replica multi_worker backup on 2 replicas" in proc.stdout
    _assert_equal(baseline, dump, 2)


def test_batch_change_is_refused_before_training_unless_asked_then_lr_is_rescaled(tmp_path):
    # One process at batch 64 killed after its 7th step: the newest backup is step 6 of
    # epoch 0 (384 examples), which is step 4 at batch 96.
    model_dir = str(tmp_path / "model")
    args = ["digits_mlp", "--seed", "0", "--deterministic", "--learning-rate", "0.1",
            "--verbose", "0", "--threads", "1", "--epochs", "1", "--strategy", "single",
            "--model-dir", model_dir]
    proc = run_py([DUMP, str(tmp_path / "unused"), "--kill-worker", "0", "--kill-at-step", "7",
                   "--marker", str(tmp_path / "marker"), *args, "--global-batch-size", "64",
                   "--save-every-steps", "6"])
    assert proc.returncode != 0 and "FAULT: worker 0 SIGKILLs itself" in proc.stdout, tail(proc)
    assert os.listdir(os.path.join(model_dir, "backup")) == ["ckpt-0000000006.npz"]

    at_96 = ["-m", "tfdist.train", *args, "--global-batch-size", "96", "--lr-scaling", "linear"]
    proc = run_py(at_96)
    assert proc.returncode == exit_codes.CONFIG, tail(proc)
    assert "--global-batch-size 64 there, 96 here" in proc.stderr, tail(proc)
    assert "--rescale-lr-on-batch-change" in proc.stderr
    assert "per_replica_batch_size" not in proc.stdout  # refused before TensorFlow started
    assert os.listdir(os.path.join(model_dir, "backup")) == ["ckpt-0000000006.npz"]

    proc = run_py([*at_96, "--rescale-lr-on-batch-change"])
    assert proc.returncode == 0, tail(proc)
    assert ("resuming a backup written at global batch 64 at global batch 96; learning rate "
            "0.1 -> 0.15 (--lr-scaling linear, relative to the backup's batch and learning "
            "rate). The math now differs from an uninterrupted run") in proc.stdout, tail(proc)
    assert ("384 examples of the current pass done at batch 64 (step 6 of epoch 0); going on "
            "at step 4 of epoch 0 at batch 96, skipping 0 example(s)") in proc.stdout
    assert "global_batch_size=96 per_replica_batch_size=96 learning_rate=0.15 " in proc.stdout
    with open(os.path.join(model_dir, "metrics.json")) as f:
        metrics = json.load(f)
    # 6 optimizer steps at 64, then the 10 steps of batch 96 left in the epoch.
    assert (metrics["global_step"], metrics["learning_rate"]) == (16, pytest.approx(0.15))
    # The optimizer trained at the new rate, not at the one its backup restored.
    assert pytest.approx(0.15) in [float(a) for a in keras_weights(
        os.path.join(model_dir, "model.keras")) if np.ndim(a) == 0 and a.dtype.kind == "f"]

    # A rerun at batch 96 needs no flag: its backups are at 96, at the rescaled rate.
    proc = run_py(["-m", "tfdist.train", *args[:-6], "--epochs", "2", "--strategy", "single",
                   "--model-dir", model_dir, "--global-batch-size", "96",
                   "--lr-scaling", "linear"])
    assert proc.returncode == 0, tail(proc)
    assert "learning_rate=0.15 " in proc.stdout and "resumed from" in proc.stdout, tail(proc)
