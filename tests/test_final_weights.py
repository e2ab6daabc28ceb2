"""Final weights written part by part (model.json + Keras's sharded weights), in-process."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tfdist import final_weights as export
from tfdist.compat import keras_h5_copies


def _model(keras):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((5, 8), name="x")
    h = keras.layers.MultiHeadAttention(2, 4, name="attn")(inputs, inputs)
    h = keras.layers.LayerNormalization(name="norm")(h)
    h = keras.layers.Dense(12, activation="relu", name="ffn_in")(h)
    return keras.Model(inputs, keras.layers.Dense(8, name="ffn_out")(h))


@pytest.mark.parametrize("tensor_parallel,piece_bytes,shard_bytes",
                         [(1, None, None), (2, None, None), (2, 24, None), (1, 24, 1000)])
def test_a_split_model_saves_sharded_weights_keras_alone_loads(
        tmp_path, monkeypatch, tensor_parallel, piece_bytes, shard_bytes):
    """24-byte pieces: every weight written into its dataset a few rows at a time (each
    shard's rows into their columns), Keras's sharded store bypassed for none; 1000-byte
    shards: the store's accounting moves on to new .weights.h5 files as Keras's would."""
    import keras

    from tfdist.model_parallel import pipeline, surgery

    split = pipeline.split(_model(keras), ["/cpu:0"] * (2 * tensor_parallel),
                           tensor_parallel=tensor_parallel)
    rng = np.random.default_rng(1)
    for v in split.variables:
        v.assign(rng.normal(size=v.shape).astype(v.dtype))
    written = []
    original = keras_h5_copies.write_in_pieces
    monkeypatch.setattr(keras_h5_copies, "write_in_pieces",
                        lambda *a: written.append(original(*a)) or written[-1])
    read = (export.values_of(split.unsplit()) if piece_bytes is None
            else export.values_of(split.unsplit(), piece_bytes=piece_bytes))
    if shard_bytes:
        monkeypatch.setattr(export, "SHARD_GB", shard_bytes / 1024 ** 3)
    names = export.save_sharded(split.plain_json, read, str(tmp_path))
    assert written and all(written)  # each weight went into its dataset in pieces
    if shard_bytes:
        assert sum(n.endswith(".weights.h5") for n in names) > 2
    assert names[0] == export.ARCHITECTURE and names[-1] == export.WEIGHTS
    assert any(n.endswith(".weights.h5") for n in names)
    assert sorted(export.sharded_files(str(tmp_path))) == sorted(names)
    # Keras alone: the architecture, then the sharded weights.
    with open(tmp_path / export.ARCHITECTURE, encoding="utf-8") as f:
        loaded = keras.models.model_from_json(f.read())
    loaded.load_weights(str(tmp_path / export.WEIGHTS))
    want = surgery.gather_model(split.unsplit())
    for a, b in zip(loaded.weights, want.weights):
        assert a.path == b.path
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_row_blocks_stay_under_the_piece_size():
    assert export.row_blocks((10, 4), 4, 48) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert export.row_blocks((10, 4), 4, 8) == [(a, a + 1) for a in range(10)]  # one row
    assert export.row_blocks((4096, 4096), 4, 4 << 20) == [(0, 256), (256, 512)] + [
        (a, a + 256) for a in range(512, 4096, 256)]
    assert export.row_blocks((), 4, 8) == [(0, 0)]  # a scalar: read whole
    assert export.row_blocks((0, 3), 4, 8) == [(0, 0)]


def test_the_form_follows_the_memory_left():
    assert export.final_form("auto", 10, 100) == "keras"
    assert export.final_form("auto", 40, 100) == "sharded"  # 3 x 40 > 100
    assert export.final_form("auto", 40, None) == "keras"  # unknown: as before
    assert export.final_form("sharded", 1, 100) == "sharded"
    assert export.final_form("keras", 40, 100) == "keras"
    from tfdist import memory_limit

    assert memory_limit.headroom_bytes() is None or memory_limit.headroom_bytes() > 0
    assert memory_limit.rss_bytes() is None or memory_limit.rss_bytes() > 2**20
