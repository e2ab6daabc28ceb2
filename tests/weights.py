"""Reading trained weights back, for every test that compares runs (one place).

Workers under test dump their weights as `w0..wN` arrays in an .npz per
worker (tests/workers/*); runs through the CLI write model.keras.
"""

from __future__ import annotations

import os
import zipfile

import numpy as np


def dump_weights(dump, prefix: str = "w") -> list:
    """The arrays `prefix`0, `prefix`1, ... of one worker's dump (a dict or NpzFile), in order."""
    keys = [k for k in dump if k.startswith(prefix) and k[len(prefix):].isdigit()]
    return [dump[k] for k in sorted(keys, key=lambda k: int(k[len(prefix):]))]


def dump_dir_weights(dump_dir: str, prefix: str = "w") -> list[list]:
    """`dump_weights` of every worker's .npz in `dump_dir`, in file-name order."""
    return [dump_weights(np.load(os.path.join(dump_dir, f)), prefix)
            for f in sorted(os.listdir(dump_dir))]


def keras_file_weights(model_keras: str) -> list:
    """Every weight array in a .keras file, in file order (h5py; no TensorFlow here)."""
    import h5py

    with zipfile.ZipFile(model_keras) as z, z.open("model.weights.h5") as f, \
            h5py.File(f, "r") as h5:
        arrays = []
        h5.visititems(lambda name, obj: arrays.append(obj[()]) if isinstance(
            obj, h5py.Dataset) else None)
    return arrays


def keras_model_weights(model_keras: str) -> list:
    """`get_weights()` of the model a .keras file holds, loaded by Keras (layer order)."""
    import keras

    return keras.saving.load_model(model_keras, compile=False).get_weights()


def ulp_nudged(weights: list, rng) -> list:
    """`weights`, each float32 element moved by one ulp in a direction drawn from `rng`.

    The floor of an equality: how far rounding alone carries a run when its
    starting weights change by the least they can (tests/workers/*).
    """
    return [np.nextafter(w, np.where(rng.random(w.shape) < 0.5, -np.inf, np.inf)
                         .astype(np.float32)) for w in weights]
