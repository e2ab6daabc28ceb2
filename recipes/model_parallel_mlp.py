"""model_parallel_mlp: a deeper MLP on the UCI digits, split over devices by default.

The same data as digits_mlp; the model is a chain of `hidden_layers` Dense
layers and a logits layer, so it splits into contiguous stages.

Launch:
    python -m tfdist.train model_parallel_mlp                            # 2 stages on 2 logical CPUs
    python -m tfdist.train model_parallel_mlp --strategy pipeline --microbatches 4
    python -m tfdist.train model_parallel_mlp --devices 4 --hidden-layers 3
    python -m tfdist.train model_parallel_mlp --placement 'hidden_0=/cpu:0;hidden_1,hidden_2,logits=/cpu:1'
    python -m tfdist.train model_parallel_mlp --strategy single           # unsplit, for comparison
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tfdist.option import Option  # noqa: E402

DEFAULTS = dict(
    strategy="model_parallel",
    devices=2,
    epochs=10,
    global_batch_size=64,
    learning_rate=0.1,
    hidden_units=Option(128, "units of each hidden layer", ge=1),
    hidden_layers=Option(3, "hidden Dense layers", ge=1, le=1000),
    test_fraction=Option(0.2, "fraction of the digits held out for the test split", gt=0, lt=1),
)


def build_model(cfg):
    import keras

    from digits_mlp import NUM_CLASSES, NUM_FEATURES

    inputs = keras.Input(shape=(NUM_FEATURES,), name="pixels")
    h = inputs
    for i in range(cfg["hidden_layers"]):
        h = keras.layers.Dense(cfg["hidden_units"], activation="relu", name=f"hidden_{i}")(h)
    outputs = keras.layers.Dense(NUM_CLASSES, name="logits")(h)
    return keras.Model(inputs, outputs, name="model_parallel_mlp")


def compile_kwargs(cfg):
    import keras

    return dict(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"])


def predict(model, inputs, cfg):
    """`python -m tfdist.predict`: as digits_mlp's (a held-out index or 64 pixels)."""
    from digits_mlp import load_arrays

    from tfdist.predict import classify

    return classify(model, inputs, load_arrays(cfg["test_fraction"])[1], "model_parallel_mlp")


def build_dataset(cfg, split):
    import tensorflow as tf

    from digits_mlp import load_arrays

    train, test = load_arrays(cfg["test_fraction"])
    return tf.data.Dataset.from_tensor_slices(train if split == "train" else test)
