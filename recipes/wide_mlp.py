"""wide_mlp: a 4.7M-parameter MLP (3 x 1024 ReLU) on synthetic data (communication-bound).

A communication-bound shape measured on this machine: 2560 inputs, three
1024-unit ReLU layers, 10 classes = 4,731,914 parameters, 19 MB of float32
gradients per step. Little compute per parameter, so at 128 examples per worker the gradient all-reduce,
not the arithmetic, sets the pace: the recipe for communication-bound scaling
benchmarks. Labels come from a fixed random linear map, so it is learnable.

Launch:
    python -m tfdist.train wide_mlp --epochs 1 --threads 1
    python -m tfdist.launch -n 2 -- python -m tfdist.train wide_mlp --strategy multi_worker \
        --global-batch-size 256 --threads 1
"""

from tfdist.option import Option

DEFAULTS = dict(
    epochs=1,
    global_batch_size=128,
    learning_rate=0.01,
    num_examples=Option(1024, "training examples generated (a test set of 1/8, at least 128)",
                        ge=1, le=10_000_000),
    input_dim=Option(2560, "input features", ge=1, le=1_000_000),
    hidden_units=Option(1024, "units of each hidden layer", ge=1, le=1_000_000),
    hidden_layers=Option(3, "hidden Dense layers", ge=1, le=1000),
    num_classes=Option(10, "classes", ge=2, le=100_000),
)


def make_arrays(num_examples, input_dim, num_classes, seed):
    """Deterministic features and labels (float32, int32)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_examples, input_dim)).astype("float32")
    w = np.random.default_rng(1234).normal(size=(input_dim, num_classes))
    return x, (x @ w).argmax(axis=1).astype("int32")


def build_model(cfg):
    import keras

    layers = [keras.Input((cfg["input_dim"],))]
    layers += [keras.layers.Dense(cfg["hidden_units"], activation="relu")
               for _ in range(cfg["hidden_layers"])]
    layers.append(keras.layers.Dense(cfg["num_classes"]))
    return keras.Sequential(layers, name="wide_mlp")


def compile_kwargs(cfg):
    import keras

    return dict(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"])


def split_arrays(cfg, split):
    """The examples of "train" or "test" (a held-out 1/8, at least 128), as arrays."""
    n = cfg["num_examples"] if split == "train" else max(cfg["num_examples"] // 8, 128)
    return make_arrays(n, cfg["input_dim"], cfg["num_classes"], seed=0 if split == "train" else 1)


def predict(model, inputs, cfg):
    """`python -m tfdist.predict`: the class of a held-out example (its index) or of one
    example given as comma-separated numbers."""
    from tfdist.predict import classify

    return classify(model, inputs, split_arrays(cfg, "test"), "wide_mlp")


def build_dataset(cfg, split):
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(split_arrays(cfg, split))
