"""The one chief-only writer, and atomic file writes.

Every file tfdist writes into a model directory goes through `ChiefWriter`:
on the chief it writes to a temporary name in the same directory and renames
it into place (so a crash never leaves a half-written file that a later run
would load); on every other worker it writes nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile


@contextlib.contextmanager
def atomic_path(path: str, suffix: str = ""):
    """Yields a temporary path beside `path`; renames it onto `path` on success.

    On error the temporary file is removed and `path` is left as it was.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=f".tmp{suffix}",
                               dir=directory)
    os.close(fd)
    # mkstemp creates the file 0600; give the result the usual umask mode.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def atomic_write_text(path: str, text: str) -> None:
    """Writes `text` to `path` atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)


class ChiefWriter:
    """Writes into `model_dir` on the chief only.

    Args:
        model_dir: Directory that receives the job's outputs.
        is_chief: Whether this process is the chief (from ClusterInfo).
    """

    def __init__(self, model_dir: str, is_chief: bool):
        self.model_dir = model_dir
        self.is_chief = is_chief

    def path(self, name: str) -> str:
        """Absolute path of `name` inside the model dir."""
        return os.path.join(self.model_dir, name)

    def write_json(self, name: str, obj) -> str | None:
        """Writes `obj` as JSON (chief only); returns the path written or None."""
        if not self.is_chief:
            return None
        path = self.path(name)
        atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
        return path

    def save_model(self, model, name: str = "model.keras") -> str | None:
        """Saves a Keras model (chief only), atomically; returns the path or None."""
        if not self.is_chief:
            return None
        path = self.path(name)
        # Keras insists on the ".keras" extension, so the temp name keeps it.
        with atomic_path(path, suffix=".keras") as tmp:
            model.save(tmp)
        return path
