"""Keras's H5 weight stores copy each value they write; `keras_h5_copies` avoids it.

Upstream (no issue filed): `ShardedH5IOStore.__setitem__` and `H5IOStore.__setitem__`
each convert the value with `backend.convert_to_numpy`, which copies a NumPy
array. Shown here by counting the conversions that copy during one sharded save
of one weight, as released and under `one_copy`; and the store's private
attributes `write_in_pieces` reads are still there.
"""

import numpy as np


def _save_counting_copies(tmp_path, wrap):
    import keras

    tmp_path.mkdir()
    from keras.src import backend

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, use_bias=False)])
    copies = []
    with wrap():
        convert = backend.convert_to_numpy

        def counting(x):
            out = convert(x)
            if isinstance(out, np.ndarray) and isinstance(x, np.ndarray) and out is not x:
                copies.append(out.nbytes)
            return out

        backend.convert_to_numpy = counting
        try:
            kernel = model.layers[0].kernel
            original = type(model.layers[0]).save_own_variables

            def save_own_variables(layer, store):  # hand the store a NumPy array, as tfdist does
                store["0"] = np.asarray(kernel.numpy())

            type(model.layers[0]).save_own_variables = save_own_variables
            try:
                model.save_weights(str(tmp_path / "m.weights.json"), max_shard_size=1.0)
            finally:
                type(model.layers[0]).save_own_variables = original
        finally:
            backend.convert_to_numpy = convert
    return copies


def test_keras_copies_each_value_twice_and_one_copy_passes_it_as_it_is(tmp_path):
    import contextlib

    from tfdist.compat import keras_h5_copies

    kernel_bytes = 64 * 64 * 4
    released = _save_counting_copies(tmp_path / "a", contextlib.nullcontext)
    assert released.count(kernel_bytes) == 2, released  # the upstream behaviour
    ours = _save_counting_copies(tmp_path / "b", lambda: keras_h5_copies.one_copy(4 << 20))
    assert ours == [], ours


def test_the_sharded_store_still_has_what_write_in_pieces_reads(tmp_path):
    from keras.src.saving import saving_lib

    from tfdist.compat import keras_h5_copies

    store = saving_lib.ShardedH5IOStore(str(tmp_path / "m.weights.json"), mode="w")
    try:
        missing = [n for n in keras_h5_copies.SHARDED_STORE if not hasattr(store, n)]
    finally:
        store.close()
    assert missing == [], f"Keras's ShardedH5IOStore no longer has {missing}"
