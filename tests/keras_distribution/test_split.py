"""ModelParallel in one process: the tensor-parallel copy trains as the model would.

Two shards on one device (a (1, 2) mesh of cpu:0 twice) run the same
arithmetic as on two devices; tests/integration/test_keras_distribution.py
runs the guide's script on 2 logical devices and on 2 processes.
"""

from __future__ import annotations

import numpy as np

import tfdist  # noqa: F401


def _model_and_data():
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(3)
    inputs = keras.Input(shape=(8,))
    x = keras.layers.Dense(6, activation="tanh", name="d1")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3, name="d2")(x))
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    rng = np.random.default_rng(0)
    data = tf.data.Dataset.from_tensor_slices(
        (rng.normal(size=(64, 8)).astype("float32"),
         rng.normal(size=(64, 3)).astype("float32"))).batch(16)
    return model, data


def test_model_parallel_trains_the_users_model_to_one_devices_weights(capsys):
    import keras

    plain, data = _model_and_data()
    plain.fit(data, epochs=2, verbose=0)
    mesh = keras.distribution.DeviceMesh((1, 2), ["batch", "model"], ["cpu:0", "cpu:0"])
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["d1/kernel"] = (None, "model")
    layout_map["d2/kernel"] = ("model", None)
    with keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch").scope():
        model, data = _model_and_data()
        model.fit(data, epochs=1, verbose=0)
        model.fit(data, epochs=1, verbose=0)  # the copy's optimizer state goes on
        predicted = model.predict(data, verbose=0)
    for a, b in zip(plain.get_weights(), model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(predicted, plain.predict(data, verbose=0), rtol=1e-5, atol=1e-6)
    line = capsys.readouterr().out
    assert "ModelParallel -> tensor parallel over 'model'" in line, line
    assert "d1/kernel (8, 6) split on axis 1: /device:CPU:0 [0:3], /device:CPU:0 [3:6]" in line
