"""keras-team/keras#18473: `keras.distribution` has no TensorFlow backend; tfdist gives it one.

The upstream stub (Keras 3.15.1) lacks `initialize`, `num_processes`,
`process_id` and `distribute_tensor`; with tfdist imported they exist and
answer, and `set_distribution` reaches tfdist's engine.
"""

from __future__ import annotations

import tfdist  # noqa: F401  (installs the backend when Keras is imported)


def test_the_stub_lacked_the_backend_and_tfdist_fills_it():
    import keras
    from keras.src.backend.tensorflow import distribution_lib as tf_lib

    from tfdist.compat import keras_tf_distribution

    gap = keras_tf_distribution.upstream_gap()
    # The upstream gap itself: if Keras ever ships these, this workaround can go.
    assert {"initialize", "num_processes", "process_id", "distribute_tensor"} <= set(gap), gap
    assert tf_lib.initialize.__module__ == "tfdist.keras_distribution.backend"
    keras.distribution.initialize()  # AttributeError upstream; one process here: a no-op
    assert tf_lib.num_processes() == 1 and tf_lib.process_id() == 0
    assert keras.distribution.list_devices()[0] == "cpu:0"


def test_set_distribution_reaches_the_engine_and_scope_restores_it():
    import keras

    from tfdist.keras_distribution import engine

    dp = keras.distribution.DataParallel(devices=["cpu:0"])
    with dp.scope():  # Keras's scope() calls set_distribution twice
        assert engine.current() is dp
        assert engine.strategy().num_replicas_in_sync == 1
    assert engine.current() is None and engine.strategy() is None


def test_a_refused_distribution_leaves_the_previous_one_current():
    import keras
    import pytest

    from tfdist.errors import ConfigError
    from tfdist.keras_distribution import engine

    mesh = keras.distribution.DeviceMesh((2, 2), ["batch", "model"],
                                         ["cpu:0", "cpu:0", "cpu:0", "cpu:0"])
    copies = keras.distribution.ModelParallel(layout_map=keras.distribution.LayoutMap(mesh),
                                              batch_dim_name="batch")
    with pytest.raises(ConfigError, match="the batch axis must have 1 device"):
        keras.distribution.set_distribution(copies)  # 2 copies of a split model, one process
    assert keras.distribution.distribution() is None and engine.current() is None


def test_weights_split_over_the_batch_axis_are_refused_when_set():
    import keras
    import pytest

    from tfdist.errors import ConfigError

    mesh = keras.distribution.DeviceMesh((2, 1), ["batch", "model"], ["cpu:0", "cpu:0"])
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["d1/kernel"] = ("batch", None)
    layout_map["d2/output"] = ("batch", None)  # an output's layout may use it
    with pytest.raises(ConfigError, match=r"'d1/kernel', \('batch', None\).*ZeRO-3"):
        keras.distribution.set_distribution(
            keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch"))
    assert keras.distribution.distribution() is None
