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


def _kinds(keras):
    """A compiled model of each kind the trainer takes, built, with its own name."""
    @keras.saving.register_keras_serializable("tfdist_test")
    class Sub(keras.Model):
        def __init__(self, units=6, **kwargs):
            super().__init__(**kwargs)
            self.units = units
            self.hidden, self.out = keras.layers.Dense(units), keras.layers.Dense(3)

        def call(self, x):
            return self.out(self.hidden(x))

        def get_config(self):
            return {**super().get_config(), "units": self.units}

    inputs = keras.Input((4,))
    functional = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Dense(6)(inputs)),
                             name="func")
    sequential = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6),
                                   keras.layers.Dense(3)], name="my_seq")
    sub = Sub(name="sub")
    sub(np.zeros((1, 4), "float32"))
    return {"sequential": sequential, "functional": functional, "subclassed": sub}


@pytest.mark.parametrize("kind", ["sequential", "functional", "subclassed"])
def test_a_compiled_unsplit_model_of_each_kind_saves_sharded_and_keras_alone_loads(
        tmp_path, kind):
    """#48: the architecture of a compiled model carries its compile config, and
    deserialising it built an optimizer in the valueless scope (every `--final-weights
    sharded` run of an unsplit model crashed); a Sequential's and a subclassed model's
    weight paths differ from their deserialised copy's."""
    import json

    import keras

    model = _kinds(keras)[kind]
    model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
    rng = np.random.default_rng(2)
    for v in model.weights:
        v.assign(rng.normal(size=v.shape).astype(v.dtype))
    assert "compile_config" in json.loads(model.to_json())
    names = export.save_sharded(model.to_json(), export.values_of(model), str(tmp_path))
    assert names[-1] == export.WEIGHTS
    text = (tmp_path / export.ARCHITECTURE).read_text(encoding="utf-8")
    assert "compile_config" not in json.loads(text)  # uncompiled: no wrapped optimizer class
    loaded = keras.models.model_from_json(text)
    loaded.load_weights(str(tmp_path / export.WEIGHTS))
    assert len(loaded.weights) == len(model.weights) == 4
    for a, b in zip(loaded.weights, model.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_weight_keys_match_by_path_then_without_the_model_name_then_by_position():
    read = {"seq/dense/kernel": (4, 6), "seq/dense/bias": (6,)}
    plain = [("dense/kernel", (4, 6)), ("dense/bias", (6,))]
    assert export.weight_keys(plain, read, "seq") == {
        "dense/kernel": "seq/dense/kernel", "dense/bias": "seq/dense/bias"}
    assert export.weight_keys(plain, {"dense/kernel": None, "dense/bias": None}, "seq") == {
        "dense/kernel": "dense/kernel", "dense/bias": "dense/bias"}
    # Automatic names renumbered (a subclassed model's): by position, shapes alike.
    renamed = [("dense_2/kernel", (4, 6)), ("dense_2/bias", (6,))]
    assert export.weight_keys(renamed, read, "seq") == {
        "dense_2/kernel": "seq/dense/kernel", "dense_2/bias": "seq/dense/bias"}
    # No guessing: another shape, another count or an unknown shape leaves them out.
    assert export.weight_keys([("dense_2/kernel", (6, 4)), ("dense_2/bias", (6,))], read,
                              "seq") == {}
    assert export.weight_keys(renamed[:1], read, "seq") == {}
    assert export.weight_keys(renamed, {"a": None, "b": (6,)}, "seq") == {}
