"""`--shard parameters` (tfdist.zero.parameters) in one process: the row split, the
refusals, and a split layer's gradient against the plain layer's.

The split layer is run as rank 0 of 2 with an engine whose all-gather adds zero rows
for the other worker and whose reduce-scatter keeps this rank's part: the model it
computes is the plain model with the other worker's rows zeroed, so its loss, and
this rank's rows of its gradient, must be that model's exactly.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tfdist import cluster, config, strategies
from tfdist.errors import ConfigError
from tfdist.zero import parameters, partition, split_optimizer


@given(st.integers(0, 300), st.integers(1, 9))
def test_rows_are_split_in_equal_padded_shares_that_cover_every_row_once(rows, n):
    shares = [partition.row_share(rows, n, r) for r in range(n)]
    per = shares[0][2]
    assert {s[2] for s in shares} == {per} and per == max(1, -(-rows // n))
    covered = [i for start, stop, _ in shares for i in range(start, stop)]
    assert covered == list(range(rows))
    assert all(stop - start <= per for start, stop, _ in shares)


def test_row_share_refuses_bad_arguments():
    for args in ((10, 0, 0), (10, 2, 2), (-1, 2, 0)):
        with pytest.raises(ValueError, match="Received"):
            partition.row_share(*args)


def _info():
    return cluster.detect({})


@pytest.mark.parametrize("optimizer", ["lamb", "adafactor", "muon"])
@pytest.mark.parametrize("strategy", ["shm", "horovod", "multi_worker"])
def test_whole_weight_optimizers_are_refused_with_one_line(optimizer, strategy):
    cfg = config.merge({}, ["--strategy", strategy, "--shard", "parameters", "--optimizer",
                            optimizer], "recipe r")
    with pytest.raises(ConfigError) as e:
        strategies.REGISTRY[strategy].check_config(cfg.typed, _info())
    assert f"Received: --optimizer {optimizer} --shard parameters" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_whole_weight_optimizer_given_to_setup_is_refused_with_one_line():
    import keras

    for optimizer in (keras.optimizers.Lamb(), keras.optimizers.Adafactor()):
        with pytest.raises(ConfigError, match="update reads a whole weight") as e:
            split_optimizer.optimizer(optimizer, _HalfEngine(), 0, 2)
        assert f"Received: {type(optimizer).__name__}" in str(e.value)
        assert "\n" not in str(e.value)
    split_optimizer.optimizer(keras.optimizers.Adam(), _HalfEngine(), 0, 2)  # elementwise: taken


def test_compression_is_refused_at_parameters_with_one_line():
    cfg = config.merge({}, ["--strategy", "multi_worker", "--shard", "parameters"], "recipe r")
    strategies.REGISTRY["multi_worker"].check_config(cfg.typed, _info())  # accepted
    cfg = config.merge({}, ["--strategy", "shm", "--shard", "parameters", "--grad-compression",
                            "fp16"], "recipe r")
    with pytest.raises(ConfigError, match="--shard parameters reduce-scatters"):
        strategies.REGISTRY["shm"].check_config(cfg.typed, _info())


def test_global_norm_clipping_is_accepted_at_parameters_on_every_engine():
    # It was refused on shm while a race in the engine's all_gather (tfdist.shm.comm)
    # handed some steps a wrong clipping norm.
    for strategy in ("shm", "horovod"):
        ok = config.merge({}, ["--strategy", strategy, "--shard", "parameters",
                               "--clipnorm", "1"], "recipe r")
        strategies.REGISTRY[strategy].check_config(ok.typed, _info())


@dataclasses.dataclass(frozen=True)
class _HalfEngine:
    """Rank 0 of 2 in one process: the other rank's rows are zeros."""

    calls: list = dataclasses.field(default_factory=list, hash=False, compare=False)

    def all_gather(self, part, name):
        import tensorflow as tf

        self.calls.append(("gather", name))
        return tf.concat([part, tf.zeros_like(part)], 0)

    def reduce_rows(self, flat, rank, n, name):
        import tensorflow as tf

        self.calls.append(("scatter", name))
        return tf.split(flat, n)[rank]  # the mean of 2 equal local gradients


def _model(seed):
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((3,), dtype="int32")
    x = keras.layers.Embedding(7, 5, name="embed")(inputs)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(9, activation="tanh", name="hidden")(x)
    return keras.Model(inputs, keras.layers.Dense(3, name="out")(x))


def test_a_split_layer_gives_its_rows_of_the_plain_gradient():
    import tensorflow as tf

    plain, split = _model(1), _model(1)
    engine = _HalfEngine()
    parameters.shard_model(split, engine, rank=0, n=2)
    assert [layer.name for layer in parameters.split_layers(plain)] == ["embed", "hidden",
                                                                        "out"]
    for v, w in zip(plain.weights, split.weights):
        start, stop, per, total = parameters.rows_of(w)
        assert (start, per, total) == (0, -(-v.shape[0] // 2), v.shape[0])
        assert tuple(w.shape) == (per, *v.shape[1:])
        assert parameters.full_shape(w) == tuple(v.shape)
        kept = np.zeros(v.shape, "float32")  # the plain model: worker 1's rows zero
        kept[:stop] = v.numpy()[:stop]
        v.assign(kept)
        np.testing.assert_array_equal(w.numpy()[:stop], kept[:stop])
    x = tf.constant([[1, 2, 2], [6, 0, 1]])
    y = tf.constant([0, 2])

    @tf.function
    def step(model):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        return loss, tape.gradient(loss, model.trainable_variables)

    want_loss, want = step(plain)
    got_loss, got = step(split)
    assert float(got_loss) == float(want_loss)
    for w, g, v in zip(split.weights, got, want):
        start, stop, per, _ = parameters.rows_of(w)
        g = tf.convert_to_tensor(g).numpy()
        assert g.shape == tuple(w.shape)
        np.testing.assert_allclose(g[:stop - start], tf.convert_to_tensor(v).numpy()[start:stop],
                                   rtol=1e-6, atol=1e-7)
        assert not g[stop - start:].any()  # padding rows get no gradient
    # Each of the 5 variables gathered in the forward pass and again in the backward
    # pass (nothing gathered is kept for it), and its gradient reduce-scattered once.
    kinds = [kind for kind, _ in engine.calls]
    assert kinds.count("gather") == 10 and kinds.count("scatter") == 5, engine.calls
    names = [name for _, name in engine.calls]
    assert len(set(names)) == len(names)  # one name each, from their order


def test_a_whole_view_reads_and_writes_rows():
    class _One:  # host collectives of one worker
        rank = 0

        def broadcast(self, arrays, root=0):
            return [np.asarray(a) for a in arrays]

    model = _model(2)
    want = [v.numpy() for v in model.weights]
    parameters.shard_model(model, _HalfEngine(), rank=0, n=2, collectives=_One())
    every, split, served = parameters.whole_view(model.weights)
    assert split is not None and len(served) == 5
    for view, full in zip(every, want):
        assert view.shape == full.shape
        view.assign(full + 1)
        start, stop, _, _ = parameters.rows_of(view.variable)
        np.testing.assert_array_equal(view.variable.numpy()[:stop - start], full[start:stop] + 1)


def test_each_worker_says_what_it_will_hold_at_parameters():
    model = _model(3)
    parameters.shard_model(model, _HalfEngine(), rank=0, n=2)
    line = split_optimizer.holdings(model.trainable_variables, [], 0, 2)
    assert line.startswith("tfdist: worker 0 of 2 (--shard parameters) holds ")
    assert "its rows of 5 split variables, 0 whole" in line
    assert "the largest weight 540 B" in line  # hidden's kernel, 15 x 9 float32
