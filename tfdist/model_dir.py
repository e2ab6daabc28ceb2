"""One job per model dir, and a model dir checked before training starts.

`claim(model_dir)` is what the chief does before TensorFlow builds anything:
create the dir (and its `backup/`), probe that it can write there, take the
dir's lock and remove the temporary files a killed job left. The run's
`writer.ChiefWriter.claim` calls it on the chief only; other workers do
nothing here. A run refused while it holds the claim (a `ConfigError` once the
model is built) removes the dirs the claim created while they are empty, so no
`backup/` is left that looks like a run.

The lock is an advisory `flock` on MODEL_DIR/.tfdist.lock, held by the chief
for the whole run, and the file records who holds it (host, pid, start time),
so a second job on the same dir is refused at once naming the holder. The
kernel drops a `flock` when its process dies however it dies (SIGKILL, OOM),
so a killed job's lock is never stale: the next job takes it over and says
whose it was. On NFS, Linux implements `flock` as a POSIX byte-range lock
(`lockf` semantics) through the NFS lock protocol, which works across hosts;
a lock of a client host that died is freed when the server's lease or grace
period ends (NFSv4: about 90 s). Filesystems without locking (ENOLCK,
EOPNOTSUPP: NFS mounted `nolock`, some FUSE filesystems) get a warning and
no lock: two jobs there are not kept apart.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import re
import socket

from tfdist import parameters
from tfdist.errors import ConfigError, StorageError, describe_os_error

LOCK_NAME = ".tfdist.lock"
BACKUP_DIR = "backup"  # MODEL_DIR/backup: the training-state backups (`checkpoint.BackupStore`)
# The names `writer.atomic_path` writes before renaming: ".NAME.XXXXXXXX.tmp[.ext]".
_TMP = re.compile(r"^\..+\.[A-Za-z0-9_]{8}\.tmp(\.[A-Za-z0-9]+)?$")
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


class ModelDirBusyError(ConfigError):
    """Another job holds the model dir's lock."""


def probe(model_dir: str) -> None:
    """Creates MODEL_DIR/backup and writes, syncs and removes a file there.

    Raises:
        StorageError: naming the path and errno (read-only, a file where a
            directory should be, a dangling symlink, no space, ...).
    """
    backup = os.path.join(model_dir, BACKUP_DIR)
    path = backup
    try:
        os.makedirs(backup, exist_ok=True)
        path = os.path.join(backup, f".probe.{os.getpid()}")
        with open(path, "wb") as f:
            f.write(b"tfdist")
            f.flush()
            os.fsync(f.fileno())
        os.remove(path)
    except OSError as e:
        raise StorageError(describe_os_error(e, path, "the model dir is not writable",
                                             _probe_advice(backup))) from None


def _probe_advice(backup: str) -> str:
    """What to do when the probe failed: a new run has nothing to resume."""
    try:
        held = [f for f in os.listdir(backup) if not f.startswith(".")]
    except OSError:  # no backup dir, or not even readable: nothing to resume from here
        held = []
    if held:
        return (f"Its backups ({len(held)} in {backup}) are intact: make the dir writable and "
                "rerun to resume, or pass --model-dir DIR to start a separate run elsewhere.")
    return ("Nothing was trained there yet: make it writable, or pass --model-dir DIR "
            "naming a directory you can write.")


def check_free_space(model_dir: str, needed: int) -> None:
    """Refuses to train when the model dir's filesystem cannot hold `needed` bytes.

    Raises:
        StorageError: naming the path, what is free and what one backup needs.
    """
    st = os.statvfs(model_dir)
    free = st.f_bavail * st.f_frsize
    if free < needed:
        raise StorageError(
            f"cannot write backups to {model_dir}: [Errno {errno.ENOSPC}] ENOSPC: "
            f"{free / 1e6:.1f} MB free, one backup needs about {needed / 1e6:.1f} MB. "
            "Free space there, or pass another --model-dir.")


def backup_bytes(variables) -> int:
    """Pure-ish: bytes one backup of `variables` takes (values plus zip overhead)."""
    total = 0
    for v in variables:
        total += parameters.count([v]) * _itemsize(v.dtype) + 512
    return total + 64 * 1024


def _itemsize(dtype) -> int:
    import numpy as np

    name = getattr(dtype, "name", dtype)
    return np.dtype(str(name)).itemsize


def remove_stale_temporaries(model_dir: str) -> list[str]:
    """Removes half-written files a killed job left (chief, under the lock)."""
    removed = []
    for d in (model_dir, os.path.join(model_dir, BACKUP_DIR)):
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            if _TMP.match(name):
                path = os.path.join(d, name)
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)
                    removed.append(path)
    return removed


class ModelDirLock:
    """The exclusive lock of one model dir (see the module docstring).

    Args:
        model_dir: The dir to lock; it must exist.
    """

    def __init__(self, model_dir: str):
        self.path = os.path.join(model_dir, LOCK_NAME)
        self._file = None
        self.previous: dict | None = None  # a dead holder's record, when taken over
        self.supported = True

    def acquire(self) -> None:
        """Takes the lock, or raises ModelDirBusyError naming the holder.

        Raises:
            ModelDirBusyError: when another process holds it.
            StorageError: when the lock file cannot be opened.
        """
        try:
            f = open(self.path, "a+", encoding="utf-8")
        except OSError as e:
            raise StorageError(describe_os_error(e, self.path, "cannot open the lock file")) from None
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in _NO_LOCKS:
                self.supported = False
                self._file = f
                return
            holder = _read(f)
            f.close()
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StorageError(describe_os_error(e, self.path, "cannot lock")) from None
            raise ModelDirBusyError(
                f"model dir {os.path.dirname(self.path)} is in use by another tfdist job "
                f"({_describe(holder)}; lock file {self.path}). Wait for that job to end or "
                "stop it, or pass another --model-dir.") from None
        self.previous = _read(f) or None
        record = {"host": socket.gethostname(), "pid": os.getpid(),
                  "started": datetime.datetime.now(datetime.timezone.utc).isoformat(
                      timespec="seconds")}
        f.seek(0)
        f.truncate()
        f.write(json.dumps(record) + "\n")
        f.flush()
        self._file = f

    def release(self) -> None:
        """Drops the lock (closing the file releases the flock).

        The record is cleared first: a record found under a free lock is then
        always a job that died holding it.
        """
        if self._file is not None:
            if self.supported:
                with contextlib.suppress(OSError):
                    self._file.seek(0)
                    self._file.truncate()
                    self._file.flush()
            self._file.close()
            self._file = None


def _read(f) -> dict:
    f.seek(0)
    try:
        return json.loads(f.read() or "{}")
    except ValueError:
        return {}


def _describe(holder: dict) -> str:
    if not holder:
        return "holder not yet recorded: it is starting"
    return (f"host {holder.get('host')}, pid {holder.get('pid')}, started "
            f"{holder.get('started')}")


@contextlib.contextmanager
def claim(model_dir: str, log=print):
    """Probes, locks and cleans `model_dir`; the chief calls it (`ChiefWriter.claim`).

    Args:
        model_dir: The job's model dir.
        log: Where to say what was taken over or removed.

    Raises:
        StorageError: when the dir cannot be created or written.
        ModelDirBusyError: when another job holds it.
        ConfigError: raised by the body; the dirs created here are removed
            first, when empty.
    """
    created = _missing(model_dir)
    probe(model_dir)
    lock = ModelDirLock(model_dir)
    lock.acquire()  # a dir another job holds existed before: nothing of it was created here
    try:
        if not lock.supported:
            log(f"warning: {model_dir} is on a filesystem without locks; another job on the "
                "same --model-dir would not be refused.")
        elif lock.previous:
            log(f"took over the lock of a job that is no longer running "
                f"({_describe(lock.previous)})")
        removed = remove_stale_temporaries(model_dir)
        if removed:
            log(f"removed {len(removed)} half-written file(s) left by an interrupted job: "
                f"{', '.join(os.path.basename(p) for p in removed)}")
        yield lock
    except ConfigError:
        lock.release()
        # A run refused once the model is built (a model that cannot be split that
        # way, a recipe's error) leaves no empty dirs that a user would take for a run.
        _remove_empty(created, lock.path)
        raise
    finally:
        lock.release()  # again is nothing


def _missing(model_dir: str) -> list[str]:
    """MODEL_DIR/backup, MODEL_DIR and its ancestors that do not exist yet, outermost first."""
    out, d = [os.path.join(model_dir, BACKUP_DIR)], os.path.abspath(model_dir)
    while d and not os.path.isdir(d) and d != os.path.dirname(d):
        out.append(d)
        d = os.path.dirname(d)
    return [p for p in reversed(out) if not os.path.isdir(p)]


def _remove_empty(created: list[str], lock_path: str) -> None:
    """Removes the dirs `claim` created, deepest first, while they hold nothing but its lock file."""
    for d in reversed(created):
        with contextlib.suppress(OSError):
            if os.listdir(d) == [LOCK_NAME] and os.path.abspath(os.path.dirname(lock_path)) == d:
                os.remove(lock_path)
            os.rmdir(d)  # fails, and the dir stays, unless it is empty

