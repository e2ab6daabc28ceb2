"""An .npz written and hashed one array at a time (pure numpy): what `np.savez` writes,
without holding every array at once, for backups and their parts."""

from __future__ import annotations

import os
import zipfile

import numpy as np


def write_npy(npz: zipfile.ZipFile, key: str, array) -> None:
    """Adds `key.npy` to an open .npz as `np.savez` does (stored, zip64 forced)."""
    with npz.open(f"{key}.npy", "w", force_zip64=True) as f:
        np.lib.format.write_array(f, np.asanyarray(array), allow_pickle=False)


def hash_array(h, key: str, array) -> None:
    """One array's part of a digest (arrays hashed in sorted key order): its key, then the
    bytes `tobytes()` gives, without the copy."""
    h.update(key.encode())
    h.update(np.ascontiguousarray(array))


def write_file(target: str, items) -> None:
    """Writes `(key, array)` pairs, one at a time as they come, to the .npz `target`,
    atomically: a temporary file of this process, then a rename."""
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    tmp = f"{target}.tmp{os.getpid()}"
    with zipfile.ZipFile(tmp, mode="w", compression=zipfile.ZIP_STORED,
                         allowZip64=True) as npz:
        for key, array in items:
            write_npy(npz, key, array)
    os.replace(tmp, target)
