"""Test worker: the TensorFlow multi-worker tutorial shape on Keras 3, no tfdist trainer.

    python tests/workers/mwms_fit_raw.py none|build|all

none: Keras as released (fails: keras-team/keras#20585, cause 1);
build: only the `_maybe_symbolic_build` fix (fails on cause 2);
all: tfdist.compat.keras_mwms.apply() (fit/evaluate/predict succeed).
"""

import sys

import numpy as np
import tensorflow as tf


def main():
    mode = sys.argv[1]
    import keras
    from keras.src.backend.tensorflow import trainer

    from tfdist.compat import keras_mwms

    if mode == "all":
        keras_mwms.apply()
    elif mode == "build":
        trainer.TensorFlowTrainer._maybe_symbolic_build = keras_mwms._maybe_symbolic_build
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    model.fit(ds, epochs=1, verbose=0)
    model.evaluate(ds, verbose=0)
    model.predict(ds.map(lambda a, b: a), verbose=0)
    print("FIT_EVALUATE_PREDICT_OK", flush=True)


if __name__ == "__main__":
    main()
