"""A model built without values, its placed copy given the values an eager build has.

The chief of a pipeline across processes never holds the whole model
(`tfdist.model_parallel.deferred`); this relies on Keras internals, checked here.
"""

import keras
import numpy as np
import pytest

from tfdist.errors import ConfigError
from tfdist.model_parallel import deferred, surgery


def build():
    inputs = keras.Input((6,), name="x")
    h = keras.layers.Dense(8, activation="relu", name="a")(inputs)
    h = keras.layers.LayerNormalization(name="norm")(h)
    h = keras.layers.Dense(4, name="b", bias_initializer="random_normal")(h)
    return keras.Model(inputs, keras.layers.Dense(3, name="c")(h))


def test_a_model_built_without_values_holds_none_and_keras_will_not_fill_them_later():
    keras.utils.set_random_seed(3)
    model = deferred.build_without_values(build)
    assert model.weights and all(deferred.is_deferred(v) for v in model.weights)
    # Keras fills registered deferred variables when any StatelessScope ends; ours
    # are not registered, so they stay empty (no value on this process).
    with keras.StatelessScope():
        pass
    assert deferred.has_deferred(model)


def test_the_placed_copy_starts_with_the_eager_builds_weights_on_its_devices():
    keras.utils.set_random_seed(3)
    eager = build()
    keras.utils.set_random_seed(3)
    lazy = deferred.build_without_values(build)
    cpu = "/job:localhost/replica:0/task:0/device:CPU:0"
    clone = surgery.placed_clone(lazy, {name: cpu for name in ("a", "norm", "b", "c")})
    assert not deferred.has_deferred(clone)
    for got, want in zip(clone.get_weights(), eager.get_weights()):
        np.testing.assert_array_equal(got, want)
    assert {v.value.device for v in clone.weights} == {cpu}
    x = np.random.default_rng(0).normal(size=(5, 6)).astype("float32")
    np.testing.assert_array_equal(clone(x), eager(x))


def test_a_copy_that_already_has_values_is_refused():
    keras.utils.set_random_seed(3)
    lazy = deferred.build_without_values(build)
    with pytest.raises(ConfigError, match="already has a value"):
        deferred.initialize_like(lazy, build())


def _transformer_block():
    inputs = keras.Input((5, 8), name="x")
    h = keras.layers.MultiHeadAttention(2, 4, name="attn")(inputs, inputs)
    h = keras.layers.Dense(12, activation="relu", name="ffn_in")(h)
    h = keras.layers.Dense(8, name="ffn_out", bias_initializer="random_normal")(h)
    return keras.Model(inputs, keras.layers.Dense(3, name="logits")(h))


def test_tensor_parallel_shards_compute_the_eager_builds_slices_on_their_own_devices():
    # Stages in processes under --tensor-parallel: the chief never holds a shard's values.
    from tfdist.model_parallel import tensor_parallel

    cpu = "/job:localhost/replica:0/task:0/device:CPU:0"
    pair = (cpu, cpu)
    keras.utils.set_random_seed(3)
    eager = surgery.placed_clone(_transformer_block(),
                                 {n: pair for n in ("attn", "ffn_in", "ffn_out", "logits")})
    keras.utils.set_random_seed(3)
    lazy = deferred.build_without_values(_transformer_block)
    clone = surgery.placed_clone(lazy, {n: pair for n in ("attn", "ffn_in", "ffn_out", "logits")})
    split = {layer.name for layer in clone.layers if tensor_parallel.is_tensor_parallel(layer)}
    assert split == {"attn", "ffn_in", "ffn_out"}
    assert not deferred.has_deferred(clone)
    assert len(clone.weights) == len(eager.weights)
    for got, want in zip(clone.weights, eager.weights):
        assert got.path == want.path
        np.testing.assert_array_equal(got.numpy(), want.numpy())
