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
