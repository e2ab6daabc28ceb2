"""Keras's H5 weight stores copy every value they write, twice in the sharded store.

Upstream: no issue filed (found by #40, Keras 3.15.1). `ShardedH5IOStore.__setitem__`
converts the value with `backend.convert_to_numpy` (`np.array(x)`: a copy) to
count it against the shard size, and `H5IOStore.__setitem__` converts it again
before `create_dataset`; so a weight is in the writing process three times at
once. For a model larger than one process that is what does not fit: the
chief of 4 stage processes of 13 x 4096 + Adam peaked 258-280 MiB above its
training peak in the final save alone.

Two ways round it, both used by `tfdist.final_weights`:

- `write_in_pieces`: what `ShardedH5IOStore.__setitem__` does (the same shard
  accounting, dataset and weight map), but the dataset is made empty and filled
  a block of rows at a time, so at most a piece of the weight is here at once.
  It reads the store's private attributes (`SHARDED_STORE`); where one is
  missing (another Keras), it does nothing and says so, and the caller writes
  the whole value.
- `one_copy`: while in it, a NumPy array passes Keras's conversion unconverted
  (the value handed to the store is already a fresh array of this process's
  own), so a whole value is held once.

`tests/compat/test_keras_h5_copies.py` shows the copies and that the
attributes are still there.
"""

from __future__ import annotations

import contextlib

from tfdist import heap

# What `write_in_pieces` reads and calls on Keras's ShardedH5IOStore.
SHARDED_STORE = ("_restore_h5_file", "max_shard_size", "current_shard_size",
                 "total_shard_size", "_create_new_shard_file", "close", "sharding_config",
                 "_h5_entry_group", "_h5_entry_initialized", "_create_h5_group",
                 "_h5_entry_path", "current_shard_path")


def write_in_pieces(store, key: str, weight) -> bool:
    """Writes `weight` into Keras's sharded H5 store as its `__setitem__` would, a piece
    at a time into a dataset made empty first.

    Args:
        store: The store Keras hands a layer's `save_own_variables`.
        key: The variable's key in it.
        weight: Has `shape`, `dtype`, `nbytes` and `write(array_like)` (puts the value
            into an array-like of its shape, piece by piece).

    Returns:
        False (nothing done) where the store is not Keras's `ShardedH5IOStore` as
        this was written against (Keras 3.15), or the dtype is one HDF5 has not
        (bfloat16): the caller then writes the whole value.
    """
    import numpy as np

    if (not all(hasattr(store, n) for n in SHARDED_STORE)
            or np.dtype(weight.dtype).kind not in "fiub"
            or np.dtype(weight.dtype).name == "bfloat16"):
        return False
    size = weight.nbytes
    if size > store.max_shard_size:
        return False  # Keras's own error names it
    store._restore_h5_file()
    store.total_shard_size += size
    store.current_shard_size += size
    if store.current_shard_size > store.max_shard_size:
        store.close()
        store.h5_file = store._create_new_shard_file()
        store.current_shard_size = size
    if not store._h5_entry_initialized:
        store._create_h5_group(store._h5_entry_path)
    weight.write(store._h5_entry_group.create_dataset(key, shape=weight.shape,
                                                      dtype=weight.dtype))
    variable_path = store._h5_entry_group.name
    weight_map = store.sharding_config["weight_map"]
    shard = store.current_shard_path.name
    if variable_path not in weight_map:
        weight_map[variable_path] = shard
    else:
        if not isinstance(weight_map[variable_path], list):
            weight_map[variable_path] = [weight_map[variable_path]]
        if shard not in weight_map[variable_path]:
            weight_map[variable_path].append(shard)
    return True


@contextlib.contextmanager
def one_copy(piece_bytes: int):
    """While in it, each NumPy value passes Keras's conversion as it is (held once).

    And glibc maps every buffer above a quarter of `piece_bytes` on its own
    (`heap.map_above`), so the pieces of the weights read from other tasks leave
    no pages behind (from then on: the threshold stays fixed for the rest of the
    process; the save ends a run, and an export is a process of its own).
    """
    import numpy as np
    from keras.src import backend

    heap.map_above(piece_bytes // 4)
    original = getattr(backend, "convert_to_numpy", None)
    if original is None:  # another Keras: its own conversion, copies or not
        yield
        return

    def convert_to_numpy(x):
        return x if type(x) is np.ndarray else original(x)

    backend.convert_to_numpy = convert_to_numpy
    try:
        yield
    finally:
        backend.convert_to_numpy = original
