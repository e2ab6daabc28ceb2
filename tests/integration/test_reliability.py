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

from tests.conftest import REPO, WORKERS, clean_env, run_py, tail
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
        assert sorted(os.listdir(model_dir)) == [".tfdist.lock", "backup"]
        assert os.listdir(os.path.join(model_dir, "backup")) == []


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
