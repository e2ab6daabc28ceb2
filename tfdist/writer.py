"""The one chief-only writer and atomic file writes.

Every file tfdist writes into a model directory goes through `ChiefWriter`:
on the chief it writes to a temporary name in the same directory and renames
it into place (so a crash never leaves a half-written file that a later run
would load); on every other worker it writes nothing. The backups
(`tfdist.checkpoint.BackupStore`) and the callbacks in `tfdist.callbacks`
take the run's writer instead of `is_chief`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile

from tfdist import model_dir as model_dir_lib
from tfdist.errors import StorageError, describe_os_error


@contextlib.contextmanager
def atomic_path(path: str, suffix: str = ""):
    """Yields a temporary path beside `path`; renames it onto `path` on success.

    On error the temporary file is removed and `path` is left as it was.

    Raises:
        StorageError: for any OSError while writing (one line naming the path
            and errno: a full disk, a read-only dir, a file where a directory
            should be).
    """
    directory = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.",
                                   suffix=f".tmp{suffix}", dir=directory)
        os.close(fd)
        # mkstemp creates the file 0600; give the result the usual umask mode.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise StorageError(describe_os_error(e, path)) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.remove(tmp)


def atomic_write_text(path: str, text: str) -> None:
    """Writes `text` to `path` atomically (for files outside a model dir: bench, status)."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)


class ChiefWriter:
    """The one chief-only writer: every file a run puts in its model dir goes through it.

    Built once per run from `ClusterInfo.is_chief` and the model dir, and
    handed to whatever writes (backups, the model, metrics.json, history.csv,
    TensorBoard logs, recipe callbacks), so the chief-only gate lives here
    and nowhere else. On the chief each file is written to a temporary name
    beside it and renamed into place (`atomic_path`); on every other worker
    nothing is written, created or removed.

    Args:
        model_dir: Directory that receives the job's outputs.
        is_chief: Whether this process is the chief (from ClusterInfo).
    """

    def __init__(self, model_dir: str, is_chief: bool):
        self.model_dir = model_dir
        self.is_chief = is_chief

    def path(self, name: str) -> str:
        """Path of `name`: a name relative to the model dir, or a path already in it.

        Paths this writer handed out (`path(...)`, `BackupStore.path_for`) come
        back as they are, whether the model dir is absolute or relative to the
        working directory; joining a relative one again would write into
        MODEL_DIR/MODEL_DIR/... where no rerun looks.
        """
        root = os.path.normpath(self.model_dir)
        norm = os.path.normpath(name)
        if os.path.isabs(name) or norm == root or norm.startswith(root + os.sep):
            return name
        return os.path.join(self.model_dir, name)

    @contextlib.contextmanager
    def claim(self, log=print):
        """Chief: probes, locks and cleans the model dir for the run (`model_dir.claim`).

        Yields the lock on the chief, None elsewhere.
        """
        if not self.is_chief:
            yield None
            return
        with model_dir_lib.claim(self.model_dir, log) as lock:
            yield lock

    def write_file(self, name: str, write, suffix: str = "") -> str | None:
        """Chief: `write(tmp_path)` fills a temporary file that is then renamed onto `name`.

        Args:
            name: The file, relative to the model dir.
            write: Called with the temporary path to write.
            suffix: Kept at the end of the temporary name (Keras insists on ".keras").

        Returns:
            The path written, or None on other workers.

        Raises:
            StorageError: one line naming the path and errno.
        """
        if not self.is_chief:
            return None
        path = self.path(name)
        with atomic_path(path, suffix=suffix) as tmp:
            write(tmp)
        return path

    def write_text(self, name: str, text: str) -> str | None:
        """Chief: writes `text` atomically; returns the path or None."""
        def write(tmp):
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)

        return self.write_file(name, write)

    def write_json(self, name: str, obj) -> str | None:
        """Chief: writes `obj` as JSON atomically; returns the path or None."""
        return self.write_text(name, json.dumps(obj, indent=2, sort_keys=True) + "\n")

    def save_model(self, model, name: str = "model.keras") -> str | None:
        """Chief: saves a Keras model atomically; returns the path or None."""
        return self.write_file(name, model.save, suffix=".keras")

    def write_files(self, write) -> list[str] | None:
        """Chief: `write(tmp_dir)` fills a temporary directory in the model dir and returns
        its file names; each is then renamed into the model dir in that order (an index
        last, so that it names only files already in place).

        Returns:
            The paths written, or None on other workers.

        Raises:
            StorageError: one line naming the path and errno.
        """
        if not self.is_chief:
            return None
        tmp = self.path(f".tmp-{os.getpid()}-files")
        try:
            os.makedirs(tmp, exist_ok=True)
            names = write(tmp)
            out = []
            for name in names:
                os.replace(os.path.join(tmp, name), self.path(name))
                out.append(self.path(name))
            return out
        except OSError as e:
            raise StorageError(describe_os_error(e, tmp)) from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def move_aside(self, name: str, suffix: str) -> str | None:
        """Chief: renames `name` to `name + suffix` (nothing if it is gone); returns the new path."""
        if not self.is_chief:
            return None
        path = self.path(name)
        with contextlib.suppress(FileNotFoundError):
            os.replace(path, path + suffix)
        return path + suffix

    def remove(self, name: str) -> None:
        """Chief: removes a file (or, for a directory, the whole tree); gone already is fine."""
        if not self.is_chief:
            return
        path = self.path(name)
        with contextlib.suppress(FileNotFoundError):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)

    def log_dir(self, name: str = "logs") -> str | None:
        """Chief: creates and returns the directory for a streaming log (TensorBoard); None elsewhere.

        Event files are appended to as training goes, so unlike every other
        file they cannot be renamed into place: they are written on the chief
        only, and a reader sees them grow.
        """
        if not self.is_chief:
            return None
        path = self.path(name)
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise StorageError(describe_os_error(e, path)) from None
        return path


# ---------------------------------------------------------------------------
# Backups: the training state a restarted job resumes from.
#
