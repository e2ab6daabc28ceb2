"""Tensor-parallel layers: the math of the shards, in-process on one device.

Two shards on the same device split the weights and sum the heads' outputs
exactly as they do on two devices, so these fast tests check the layers'
equivalence with their plain Keras layers, the conversions both ways, the
feed-forward pairing and the refusals; tests/model_parallel/test_equality.py
(one subprocess with 4 logical CPUs) checks devices and training.
"""

from __future__ import annotations

import numpy as np
import pytest

from tfdist.errors import ConfigError
from tfdist.model_parallel import plan, surgery
from tfdist.model_parallel.graph import Graph, Node
from tfdist.model_parallel.graph import dense_pairs

SAME = ["/cpu:0", "/cpu:0"]  # two shards, one device
FORWARD = dict(rtol=1e-5, atol=1e-6)  # only the heads' sum runs in another order


def _graph(nodes, outputs):
    return Graph(tuple(Node(n, tuple(i), tuple(o), True) for n, i, o in nodes), (0,),
                 tuple(outputs))


def test_a_dense_read_only_by_a_dense_pairs_column_then_row():
    g = _graph([("norm", [0], [1]), ("ffn_in", [1], [2]), ("ffn_out", [2], [3]),
                ("add", [0, 3], [4]), ("logits", [4], [5])], [5])
    assert dense_pairs(g, {"ffn_in", "ffn_out", "logits"}) == {"ffn_in": "column",
                                                               "ffn_out": "row"}


def test_pairs_do_not_overlap_and_need_a_sole_dense_reader():
    chain = _graph([("d0", [0], [1]), ("d1", [1], [2]), ("d2", [2], [3])], [3])
    assert dense_pairs(chain, {"d0", "d1", "d2"}) == {"d0": "column", "d1": "row"}
    # d0's output is read twice (by d1 and by the add), or is a model output: no pair.
    branched = _graph([("d0", [0], [1]), ("d1", [1], [2]), ("add", [1, 2], [3])], [3])
    assert dense_pairs(branched, {"d0", "d1"}) == {}
    output = _graph([("d0", [0], [1]), ("d1", [1], [2])], [1, 2])
    assert dense_pairs(output, {"d0", "d1"}) == {}
    # A reader that is no Dense, or a Dense called twice (shared), makes no pair either.
    assert dense_pairs(chain, {"d0", "d2"}) == {}
    shared = _graph([("d0", [0], [1]), ("d1", [1], [2]), ("d1", [2], [3])], [3])
    assert dense_pairs(shared, {"d0", "d1"}) == {}


def test_tensor_parallel_degree_fits_the_devices():
    assert plan.check_tensor_parallel(0, 1) == 1 and plan.check_tensor_parallel(4, 2) == 2
    with pytest.raises(ConfigError, match=r"--tensor-parallel 2 needs --devices P\*2 .* "
                                          r"Received: --devices 3\. Use --devices 2"):
        plan.check_tensor_parallel(3, 2)
    with pytest.raises(ConfigError, match="Received: --devices 0"):
        plan.check_tensor_parallel(0, 2)
    with pytest.raises(ConfigError, match="Drop --placement"):
        plan.check_tensor_parallel(4, 2, placement=True)


@pytest.fixture(scope="module")
def tp():
    import keras

    from tfdist.model_parallel import tensor_parallel

    keras.utils.set_random_seed(0)
    return tensor_parallel


def _inputs(*shapes):
    rng = np.random.default_rng(0)
    return [rng.normal(size=s).astype("float32") for s in shapes]


@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("kind", ["self", "causal", "cross", "masked"])
def test_head_parallel_attention_equals_multi_head_attention(tp, use_bias, kind):
    import keras

    q, kv = _inputs((3, 5, 16), (3, 7, 12))
    mha = keras.layers.MultiHeadAttention(5, 4, value_dim=3, use_bias=use_bias)
    args, kwargs = {"self": ((q, q), {}), "causal": ((q, q), {"use_causal_mask": True}),
                    "cross": ((q, kv), {}),
                    "masked": ((q, q), {"use_causal_mask": True,
                                        "attention_mask": np.tril(np.ones((3, 5, 5)), 1) > 0})
                    }[kind]
    expected = mha(*args, **kwargs)
    split = tp.layer_classes()["HeadParallelAttention"].from_layer(mha, SAME)
    assert split.bounds == [(0, 3), (3, 5)]  # 5 heads: 3 + 2
    np.testing.assert_allclose(split(*args, **kwargs), expected, **FORWARD)
    assert split.shards[1]["query_kernel"].shape == (16, 2, 4)
    assert split.shards[1]["output_kernel"].shape == (2, 3, 16)
    plain = split.to_plain()
    assert type(plain) is keras.layers.MultiHeadAttention and plain.name == mha.name
    for a, b in zip(plain.get_weights(), mha.get_weights()):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(plain(*args, **kwargs), expected)


def test_column_and_row_dense_equal_the_dense_pair_and_convert_back(tp):
    import keras

    (x,) = _inputs((4, 6, 10))
    first = keras.layers.Dense(7, activation="relu")
    second = keras.layers.Dense(5, activation="tanh")
    expected = second(first(x))
    classes = tp.layer_classes()
    column = classes["ColumnParallelDense"].from_layer(first, SAME)
    row = classes["RowParallelDense"].from_layer(second, SAME)
    hidden = column(x)
    assert hidden.shape == (4, 6, 7)  # one gathered tensor, as the Dense hands on
    np.testing.assert_allclose(row(hidden), expected, **FORWARD)
    assert [k.shape for k in column.kernels] == [(10, 4), (10, 3)]
    assert [k.shape for k in row.kernels] == [(4, 5), (3, 5)]
    for split, dense in ((column, first), (row, second)):
        plain = split.to_plain()
        assert type(plain) is keras.layers.Dense and plain.get_config()["activation"] == \
            dense.get_config()["activation"]
        for a, b in zip(plain.get_weights(), dense.get_weights()):
            np.testing.assert_array_equal(a, b)


def test_parallel_mlp_keeps_megatrons_handoff(tp):
    (x,) = _inputs((8, 16))
    block = tp.ParallelMLP(12, 3, SAME)
    block(x)
    hidden = block.column(x)
    assert isinstance(hidden, list) and [h.shape for h in hidden] == [(8, 6), (8, 6)]
    w = block.dense_weights()
    np.testing.assert_allclose(block(x), np.maximum(x @ w[0] + w[1], 0) @ w[2] + w[3],
                               **FORWARD)


def test_clone_function_and_gather_model_round_trip(tp):
    import keras

    from tfdist.model_parallel import placement

    tokens = keras.Input((6, 8), name="tokens")
    h = keras.layers.MultiHeadAttention(2, 4, name="attn")(tokens, tokens)
    h = keras.layers.Dense(16, activation="relu", name="ffn_in")(h)
    h = keras.layers.Dense(8, name="ffn_out")(h)
    model = keras.Model(tokens, keras.layers.Dense(3, name="logits")(h))
    roles = surgery.feed_forward_pairs(model)
    assert roles == {"ffn_in": "column", "ffn_out": "row"}
    split = keras.models.clone_model(
        model, clone_function=surgery.tensor_parallel_clone_function(SAME, roles))
    surgery.copy_weights(model, split)
    kinds = {layer.name: type(layer).__name__ for layer in split.layers}
    assert kinds == {"tokens": "InputLayer", "attn": "HeadParallelAttention",
                     "ffn_in": "ColumnParallelDense", "ffn_out": "RowParallelDense",
                     "logits": "Dense"}
    assert split.get_layer("logits")._tfdist_device == "/cpu:0"  # placed on devices[0]
    (x,) = _inputs((2, 6, 8))
    np.testing.assert_allclose(split(x), model(x), **FORWARD)
    assert [r[1] for r in placement.placement_rows(split.layers[1:])] == ["CPU:0"] * 4
    plain = surgery.gather_model(split)
    assert {type(layer).__module__.split(".")[0] for layer in plain.layers} == {"keras"}
    for a, b in zip(plain.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert surgery.gather_model(model) is model  # nothing to gather


def test_unsupported_features_are_refused_naming_the_layer(tp):
    import keras

    q = _inputs((2, 3, 8))[0]
    classes = tp.layer_classes()
    dropout = keras.layers.MultiHeadAttention(2, 4, dropout=0.1, name="drop_attn")
    dropout(q, q)
    with pytest.raises(ValueError, match="cannot replace layer 'drop_attn': it has attention "
                                         "dropout"):
        classes["HeadParallelAttention"].from_layer(dropout, SAME)
    with pytest.raises(ValueError, match="cannot split 1 head"):
        classes["HeadParallelAttention"](1, 4, SAME)
    constrained = keras.layers.Dense(4, kernel_constraint="non_neg", name="pos")
    constrained(q)
    with pytest.raises(ValueError, match="'pos': it has a kernel constraint"):
        classes["ColumnParallelDense"].from_layer(constrained, SAME)


@pytest.mark.parametrize("kind", ["self", "cross"])
def test_gradients_equal_the_plain_layers_gradients(tp, kind):
    # Each shard's backward is its own tape's (so it runs on the shard's device); one
    # tensor given as query, key and value must still get each use's gradient once.
    import keras
    import tensorflow as tf

    q, kv = _inputs((2, 5, 8), (2, 4, 8))
    mha = keras.layers.MultiHeadAttention(2, 4, name="a")
    dense = keras.layers.Dense(6, activation="relu")
    out = keras.layers.Dense(8)
    value = q if kind == "self" else kv
    mha(q, value), out(dense(q))
    classes = tp.layer_classes()
    split = [classes["HeadParallelAttention"].from_layer(mha, SAME),
             classes["ColumnParallelDense"].from_layer(dense, SAME),
             classes["RowParallelDense"].from_layer(out, SAME)]

    def grads(attn, first, second):
        x, v = tf.constant(q), tf.constant(value) if kind == "cross" else None
        with tf.GradientTape() as tape:
            tape.watch([x] + ([v] if v is not None else []))
            h = attn(x, v if v is not None else x, use_causal_mask=kind == "self")
            loss = tf.reduce_sum(second(first(h)) ** 2)
        sources = [x] + ([v] if v is not None else [])
        variables = [w for layer in (attn, first, second) for w in layer.trainable_weights]
        g = tape.gradient(loss, [*sources, *variables])
        return g[:len(sources)], g[len(sources):]

    (x_plain, w_plain), (x_split, w_split) = grads(mha, dense, out), grads(*split)
    for a, b in zip(x_split, x_plain):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    # The shards' gradients, gathered as their weights are, are the plain ones.
    flat, k = [], 0
    for layer in split:
        n = len(layer.trainable_weights)
        shadow = {id(v): g for v, g in zip(layer.trainable_weights, w_split[k:k + n])}
        k += n
        for group, axis in layer._plain_groups():
            parts = [shadow[id(v)].numpy() for v in group]
            flat.append(parts[0] if axis is None else np.concatenate(parts, axis=axis))
    assert len(flat) == len(w_plain)
    for a, b in zip(flat, w_plain):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_split_with_tensor_parallel_refuses_per_variable_clipnorm(tp):
    import keras

    from tfdist.model_parallel import pipeline

    tokens = keras.Input((4, 8))
    h = keras.layers.Dense(16, activation="relu", name="ffn_in")(tokens)
    model = keras.Model(tokens, keras.layers.Dense(8, name="ffn_out")(h))
    split = pipeline.split(model, SAME, tensor_parallel=2)
    assert [type(layer).__name__ for layer in split.pipeline_layers] == [
        "ColumnParallelDense", "RowParallelDense"]
    split.compile(optimizer=keras.optimizers.Adam(global_clipnorm=1.0), loss="mse")  # global: fine
    with pytest.raises(ConfigError, match=r"clipnorm=1.0\), but tensor-parallel layers "
                                          r"\('ffn_in' and 1 more\)"):
        split.compile(optimizer=keras.optimizers.Adam(clipnorm=1.0), loss="mse")


def test_keras_masks_of_the_inputs_are_honoured_as_multi_head_attention_does(tp):
    import keras

    tokens = np.array([[3, 4, 0, 0, 0], [5, 6, 7, 8, 0]], "int32")
    embed = keras.layers.Embedding(10, 8, mask_zero=True)
    mha = keras.layers.MultiHeadAttention(2, 4)
    x = embed(tokens)
    expected = mha(x, x)
    split = tp.layer_classes()["HeadParallelAttention"].from_layer(mha, SAME)
    np.testing.assert_allclose(split(embed(tokens), embed(tokens)), expected, **FORWARD)
    unmasked = mha(keras.ops.convert_to_tensor(x.numpy()), keras.ops.convert_to_tensor(x.numpy()))
    assert np.abs(np.asarray(unmasked) - np.asarray(expected)).max() > 1e-3  # the mask mattered


def test_optimizers_reading_whole_variables_are_refused_on_shards(tp):
    import keras

    tokens = keras.Input((4, 8))
    h = keras.layers.Dense(16, activation="relu", name="ffn_in")(tokens)
    model = keras.Model(tokens, keras.layers.Dense(8, name="ffn_out")(h))
    split = [surgery.parallel_copy(model.get_layer("ffn_in"), SAME, "column"),
             surgery.parallel_copy(model.get_layer("ffn_out"), SAME, "row")]
    for optimizer in (keras.optimizers.Adam(global_clipnorm=1.0), keras.optimizers.SGD(0.1),
                      keras.optimizers.Lion(), keras.optimizers.AdamW()):
        tp.check_optimizer(optimizer, split)  # elementwise steps, one global norm: fine
    # Without a tensor-parallel layer every variable is whole: nothing to refuse.
    tp.check_optimizer(keras.optimizers.Lamb(), model.layers)
    for optimizer, what in ((keras.optimizers.Lamb(), "Lamb scales"),
                            (keras.optimizers.Adafactor(), "Adafactor scales"),
                            (keras.mixed_precision.LossScaleOptimizer(keras.optimizers.Lamb()),
                             "Lamb scales"),
                            (keras.optimizers.Adam(clipnorm=1.0), r"own norm \(clipnorm=1.0")):
        with pytest.raises(ConfigError, match=rf"{what}.*tensor-parallel layers \('ffn_in' "
                                              r"and 1 more\).*or no tensor parallelism"):
            tp.check_optimizer(optimizer, split)


def test_parallel_mlp_is_a_tensor_parallel_layer_checked_and_gathered_like_the_others():
    # It was a plain Layer: gather_model kept its shards and the optimizer check missed it.
    import keras

    from tfdist.model_parallel import tensor_parallel as tp

    keras.utils.set_random_seed(0)
    inputs = keras.Input((5,))
    block = tp.ParallelMLP(12, 3, SAME, name="mlp")
    model = keras.Model(inputs, block(inputs))
    assert tp.is_tensor_parallel(block)
    with pytest.raises(ConfigError, match="Lamb.*'mlp'"):
        tp.check_optimizer(keras.optimizers.Lamb(), model.layers)
    plain = surgery.gather_model(model)
    assert not any(tp.is_tensor_parallel(layer) for layer in plain.layers)
    x = np.random.default_rng(0).normal(size=(4, 5)).astype("float32")
    np.testing.assert_allclose(plain(x), model(x), **FORWARD)
