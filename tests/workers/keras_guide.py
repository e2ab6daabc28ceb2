"""Test worker: keras.io's distribution guide, as written, with `import tfdist` on top.

    TFDIST_DEVICES=2 python tests/workers/keras_guide.py local OUT_DIR
    python -m tfdist.launch -n 2 -- python tests/workers/keras_guide.py processes OUT_DIR

A functional model (Dense "d1", Dense "d2"), Adam, a `tf.data` dataset
batched at 64, `model.fit`, op determinism on. `local` trains it on one
device, under `DataParallel` over the 2 logical devices and under
`ModelParallel` on a (1, 2) mesh (d1/kernel (None, "model"), d1/bias
("model",), d2/kernel ("model", None)), then asks for a layout no split can
honour (d1/kernel ("model", "model")) and writes the error. `processes` calls
`keras.distribution.initialize()`, trains under `DataParallel` over every
process's device, then trains again with process 1's labels changed. Writes
OUT_DIR/<name>-<process>.npz (weights in `get_weights()` order) and
OUT_DIR/report-<process>.json.
"""

import json
import os
import sys

import tfdist  # noqa: F401  (gives keras.distribution its TensorFlow backend)
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def make_model():
    keras.utils.set_random_seed(1)
    inputs = keras.Input(shape=(16,))
    x = keras.layers.Dense(32, activation="tanh", name="d1")(inputs)
    outputs = keras.layers.Dense(4, name="d2")(x)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def dataset(flip: bool = False):
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(512, 16)).astype("float32")
    ys = rng.integers(0, 4, size=(512,))
    if flip:
        ys = (ys + 1) % 4
    return tf.data.Dataset.from_tensor_slices((xs, ys)).batch(64)


def train(out_dir, name, flip=False):
    model = make_model()
    model.fit(dataset(flip), epochs=2, verbose=0)
    pid = keras.distribution.distribution().num_processes and _process_id()
    np.savez(os.path.join(out_dir, f"{name}-{pid}.npz"), *model.get_weights())
    return model


def _process_id():
    from keras.src.backend import distribution_lib

    return distribution_lib.process_id()


def local(out_dir):
    report = {"devices": keras.distribution.list_devices()}
    devices = report["devices"]
    model = make_model()
    model.fit(dataset(), epochs=2, verbose=0)
    np.savez(os.path.join(out_dir, "single-0.npz"), *model.get_weights())

    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
    model = train(out_dir, "data_parallel")
    report["data_parallel_kernel_devices"] = sorted(
        {v.device for v in model.layers[1].kernel.value.values})

    mesh = keras.distribution.DeviceMesh((1, len(devices)), ["batch", "model"], devices)
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(layout_map=_layouts(mesh), batch_dim_name="batch"))
    train(out_dir, "model_parallel")

    bad = keras.distribution.LayoutMap(mesh)
    bad["d1/kernel"] = ("model", "model")
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(layout_map=bad, batch_dim_name="batch"))
    model = make_model()
    before = [w.copy() for w in model.get_weights()]
    try:
        model.fit(dataset(), epochs=1, verbose=0)
        report["refused"] = None
    except ValueError as e:
        report["refused"] = f"{type(e).__name__}: {e}"
    report["untouched"] = all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    return report


def processes(out_dir):
    keras.distribution.initialize()
    devices = keras.distribution.list_devices()
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
    train(out_dir, "processes")
    train(out_dir, "flipped", flip=_process_id() == 1)
    return {"devices": devices, "num_processes": keras.distribution.distribution().num_processes}


def hybrid(out_dir):
    """2 processes x 2 devices: the batch axis across processes, the model axis within."""
    keras.distribution.initialize()
    devices = keras.distribution.list_devices()
    mesh = keras.distribution.DeviceMesh((2, len(devices) // 2), ["batch", "model"], devices)
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(layout_map=_layouts(mesh), batch_dim_name="batch"))
    train(out_dir, "hybrid")
    return {"devices": devices}


def _layouts(mesh):
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["d1/kernel"] = (None, "model")
    layout_map["d1/bias"] = ("model",)
    layout_map["d2/kernel"] = ("model", None)
    return layout_map


def main():
    mode, out_dir = sys.argv[1], sys.argv[2]
    tf.config.experimental.enable_op_determinism()
    report = {"local": local, "processes": processes, "hybrid": hybrid}[mode](out_dir)
    with open(os.path.join(out_dir, f"report-{_process_id()}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
