"""A `.keras` save buffers the whole weights file in memory when the host has room.

Upstream: keras-team/keras#19989 (Keras 3.4+; measured on Keras 3.15.1).
`saving_lib._save_model_to_fileobj` writes `model.weights.h5` into memory
first, then into the zip, whenever `is_memory_sufficient(model)`: the weights
under half of psutil's available memory. That is the host's memory, not a
memory cgroup's limit, and it counts every weight of the model, not what
this process holds. Otherwise Keras writes the file to a temporary file beside
the target and copies it into the zip.

A pipeline's chief saves the whole model while holding one stage, and a memory
cgroup caps it below what the host has free: in memory, the file of every
stage's weights comes on top of its own stage. And Keras's store reads each
weight whole (`H5IOStore.__setitem__`: `np.array(variable)`), which for another
process's weight is its bytes received, a tensor and a numpy copy at once.
`on_disk()` makes Keras take its temporary-file path inside it, and its store
write each weight over `PIECE_BYTES` in row ranges, each read on the weight's
own device; the file written is the same, to the bit.

Measured (`bench pipeline-processes --parts memory`, 13 x 4096 x 4096 + Adam,
2 stage processes, M = 2, 2026-11-28): the chief's whole-run peak was 2464 MiB,
0.677 of one process's, 221 MiB over its training peak, all of it the final
save; with `on_disk()` 2295 MiB, 0.631 (training: 2243 MiB, 0.634).
"""

from __future__ import annotations

import contextlib

UPSTREAM_ISSUES = ("keras-team/keras#19989",)
PIECE_BYTES = 8 << 20  # a weight is read and written in row ranges of at most this


@contextlib.contextmanager
def on_disk():
    """Keras's `.keras` saves inside write the weights file through a temporary file,
    each weight over `PIECE_BYTES` in row ranges read on its own device.

    Yields:
        True where Keras has the choice this replaces (`saving_lib.is_memory_sufficient`),
        False where it moved (saving then works as that Keras decides).
    """
    from keras.src.saving import saving_lib

    original = getattr(saving_lib, "is_memory_sufficient", None)
    store = getattr(saving_lib, "H5IOStore", None)
    whole = getattr(store, "__setitem__", None)
    if original is None or whole is None or not hasattr(store, "_create_h5_group"):
        yield False
        return
    saving_lib.is_memory_sufficient = lambda model: False
    store.__setitem__ = _in_pieces(whole)
    try:
        yield True
    finally:
        saving_lib.is_memory_sufficient = original
        store.__setitem__ = whole


def _in_pieces(whole):
    """`H5IOStore.__setitem__` writing a large float weight in row ranges, each read on
    the weight's own device; anything else (or a store in read mode) as Keras does."""

    def setitem(self, key, value):
        import numpy as np
        import tensorflow as tf

        held = getattr(value, "value", value)  # a Keras variable's tf.Variable
        shape = tuple(getattr(held, "shape", ()))
        dtype = getattr(getattr(held, "dtype", None), "as_numpy_dtype", None)
        if (self.mode not in ("w", "a") or not isinstance(held, tf.Variable) or not shape
                or dtype is None or not np.issubdtype(dtype, np.floating)
                or int(np.prod(shape)) * np.dtype(dtype).itemsize <= PIECE_BYTES):
            return whole(self, key, value)
        if not self._h5_entry_initialized:
            self._create_h5_group(self._h5_entry_path)
        dataset = self._h5_entry_group.create_dataset(key, shape=shape, dtype=dtype)
        row = max(1, int(np.prod(shape[1:])) * np.dtype(dtype).itemsize)
        step = max(1, PIECE_BYTES // row)
        for start in range(0, shape[0], step):
            with tf.device(held.device):
                piece = tf.identity(held[start:start + step])
            dataset[start:start + step] = piece.numpy()

    return setitem
