"""The model dir's lock, probe and clean-up, with real processes holding the lock (no TensorFlow)."""

import errno
import json
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO, clean_env
from tfdist import model_dir
from tfdist.checkpoint import BackupStore, TrainState
from tfdist.writer import ChiefWriter, atomic_path
from tfdist.errors import StorageError

HOLD = ("import sys, time; from tfdist import model_dir; "
        "lock = model_dir.ModelDirLock(sys.argv[1]); lock.acquire(); print('held', flush=True); "
        "time.sleep(float(sys.argv[2])); lock.release(); print('released', flush=True)")


def _holder(path, seconds):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), str(seconds)], cwd=REPO,
                            env=clean_env(), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.integration
def test_second_holder_is_refused_naming_the_first(tmp_path):
    holder = _holder(tmp_path, 60)
    try:
        with pytest.raises(model_dir.ModelDirBusyError) as e:
            model_dir.ModelDirLock(str(tmp_path)).acquire()
        message = str(e.value)
        assert f"pid {holder.pid}" in message and "host " in message and "started 20" in message
        assert str(tmp_path) in message and "--model-dir" in message
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.integration
def test_killed_holders_lock_is_taken_over(tmp_path):
    holder = _holder(tmp_path, 60)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    logs = []
    with ChiefWriter(str(tmp_path), True).claim(logs.append) as lock:
        assert lock.previous["pid"] == holder.pid
        record = json.load(open(tmp_path / model_dir.LOCK_NAME))
        assert record["pid"] == os.getpid()
    assert any(f"pid {holder.pid}" in m and "no longer running" in m for m in logs)
    # Released cleanly: the next claim has nothing to take over.
    logs.clear()
    with ChiefWriter(str(tmp_path), True).claim(logs.append) as lock:
        assert lock.previous is None and not logs


@pytest.mark.integration
def test_lock_released_when_the_holder_ends(tmp_path):
    holder = _holder(tmp_path, 0.5)
    assert holder.stdout.readline().strip() == "released"
    holder.wait()
    lock = model_dir.ModelDirLock(str(tmp_path))
    lock.acquire()
    lock.release()


def test_non_chief_claims_nothing(tmp_path):
    with ChiefWriter(str(tmp_path / "m"), False).claim() as lock:
        assert lock is None
    assert not (tmp_path / "m").exists()


def test_stale_temporaries_are_removed_and_others_kept(tmp_path):
    backup = tmp_path / "backup"
    backup.mkdir()
    stale = [backup / ".ckpt-0000000004.npz.ab_12xyz.tmp.npz", tmp_path / ".model.keras.k2j4l6m8.tmp.keras",
             tmp_path / ".metrics.json.zzzzzzzz.tmp"]
    kept = [backup / "ckpt-0000000004.npz", tmp_path / "history.csv", tmp_path / ".hidden"]
    for p in stale + kept:
        p.write_bytes(b"x")
    logs = []
    with ChiefWriter(str(tmp_path), True).claim(logs.append):
        pass
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in kept)
    assert "removed 3 half-written file(s)" in logs[0]


@pytest.mark.parametrize("make", ["file", "dangling_backup", "backup_file"])
def test_probe_names_the_path_and_errno(tmp_path, make):
    target = tmp_path / "m"
    if make == "file":
        target.write_text("not a dir")
        bad = target
    else:
        target.mkdir()
        bad = target / "backup"
        if make == "dangling_backup":
            os.symlink(tmp_path / "nowhere", bad)
        else:
            bad.write_text("not a dir")
    with pytest.raises(StorageError) as e:
        model_dir.probe(str(target))
    message = str(e.value)
    assert "\n" not in message
    assert str(bad) in message and ("[Errno 17] EEXIST" in message or "ENOTDIR" in message)


@pytest.mark.parametrize("has_backup", [False, True])
def test_read_only_dir_advice_depends_on_whether_there_is_a_run_to_resume(
        tmp_path, monkeypatch, has_backup):
    # chmod does not stop root (the CI user), so the write fails as a read-only mount would.
    target = tmp_path / "m"
    (target / "backup").mkdir(parents=True)
    if has_backup:
        (target / "backup" / "ckpt-0000000004.npz").write_bytes(b"x")
    real_open = open

    def read_only(path, *args, **kwargs):
        if ".probe." in str(path):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", read_only)
    with pytest.raises(StorageError) as e:
        model_dir.probe(str(target))
    message = str(e.value)
    assert "\n" not in message and "[Errno 30] EROFS" in message
    if has_backup:
        assert "backups (1 in" in message and "rerun to resume" in message
    else:
        assert "Nothing was trained there yet" in message and "--model-dir DIR" in message
        assert "resume" not in message and "intact" not in message


def test_free_space_check_names_both_sizes(tmp_path):
    model_dir.check_free_space(str(tmp_path), 1)
    with pytest.raises(StorageError, match=r"ENOSPC: .* MB free, one backup needs about"):
        model_dir.check_free_space(str(tmp_path), 1 << 62)


def test_write_error_is_one_line_and_leaves_the_target(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(StorageError) as e:
        with atomic_path(str(target)) as tmp:
            raise OSError(errno.ENOSPC, "No space left on device")
    assert f"{target}: [Errno 28] ENOSPC: No space left on device" in str(e.value)
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["out.txt"]


def test_pruning_tolerates_backups_already_gone(tmp_path, monkeypatch):
    class V:
        path, shape, dtype = "v", (1,), "float32"

        def numpy(self):
            import numpy as np
            return np.zeros(1, "float32")

    store = BackupStore(ChiefWriter(str(tmp_path), True), keep=1)
    store.save(TrainState(global_step=1), [V()], [], {})
    real_paths = store.paths
    # Another process removed the old backup between listing and removing.
    def listed_then_gone():
        paths = real_paths()
        for p in paths[:-1]:
            os.remove(p)
        return paths
    monkeypatch.setattr(store, "paths", listed_then_gone)
    store.save(TrainState(global_step=2), [V()], [], {})
    assert [os.path.basename(p) for p in real_paths()] == ["ckpt-0000000002.npz"]


def test_a_run_refused_after_the_claim_leaves_no_dirs_it_created(tmp_path):
    from tfdist.errors import ConfigError

    new = tmp_path / "runs" / "r" / "pipeline-3st"
    with pytest.raises(ConfigError):
        with model_dir.claim(str(new), log=lambda m: None):
            assert (new / "backup").is_dir()
            raise ConfigError("Cannot split the model into 3 stages")
    assert os.listdir(tmp_path) == []  # no empty backup/ a user would take for a run
    # A dir that was there keeps what it held; only the empty backup/ made now goes.
    old = tmp_path / "old"
    old.mkdir()
    (old / "metrics.json").write_text("{}")
    with pytest.raises(ConfigError):
        with model_dir.claim(str(old), log=lambda m: None):
            raise ConfigError("refused")
    assert sorted(os.listdir(old)) == [model_dir.LOCK_NAME, "metrics.json"]
    with model_dir.claim(str(old), log=lambda m: None):  # an ordinary run keeps its backup/
        pass
    assert "backup" in os.listdir(old)
