"""synthetic_cnn: a small CNN on generated 32x32 RGB images (compute-bound).

Heavier per example than digits_mlp and light on parameters, so it is the
recipe for scaling benchmarks: compute, not gradient traffic, sets its pace.
The images are made here (no download): each class is a noisy image with a
bright bar at a class-specific position and orientation, so it is learnable.

Launch:
    python -m tfdist.train synthetic_cnn --epochs 2
    python -m tfdist.launch -n 2 -- python -m tfdist.train synthetic_cnn --strategy multi_worker
"""

from tfdist.option import Option

DEFAULTS = dict(
    epochs=3,
    global_batch_size=64,
    learning_rate=0.05,
    momentum=0.9,
    num_examples=Option(2048, "training images generated (a test set of 1/8, at least 64)",
                        ge=1, le=10_000_000),
    num_classes=Option(8, "classes (a bar's position and orientation)", ge=2, le=16),
    image_size=Option(32, "image height and width in pixels", ge=16, le=1024),
    filters=Option(32, "filters of the first convolutions", ge=1, le=4096),
    noise=Option(0.3, "standard deviation of the pixel noise", ge=0),
)


def make_arrays(num_examples, num_classes, image_size, noise, seed):
    """Deterministic images and labels (float32 NHWC, int32)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    y = rng.integers(0, num_classes, size=num_examples).astype("int32")
    x = rng.normal(0.0, noise, size=(num_examples, image_size, image_size, 3)).astype("float32")
    step = image_size // (num_classes // 2 + 1)
    for i, label in enumerate(y):
        pos = step * (label // 2 + 1)
        if label % 2:
            x[i, :, pos - 1:pos + 1, :] += 1.0  # vertical bar
        else:
            x[i, pos - 1:pos + 1, :, :] += 1.0  # horizontal bar
    return x, y


def build_model(cfg):
    import keras

    f = cfg["filters"]
    return keras.Sequential([
        keras.Input((cfg["image_size"], cfg["image_size"], 3)),
        keras.layers.Conv2D(f, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(f, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(2 * f, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(cfg["num_classes"]),
    ], name="synthetic_cnn")


def compile_kwargs(cfg):
    import keras

    return dict(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"])


def split_arrays(cfg, split):
    """The examples of "train" or "test" (a held-out 1/8, at least 64), as arrays."""
    n = cfg["num_examples"] if split == "train" else max(cfg["num_examples"] // 8, 64)
    return make_arrays(n, cfg["num_classes"], cfg["image_size"], cfg["noise"],
                       seed=0 if split == "train" else 1)


def predict(model, inputs, cfg):
    """`python -m tfdist.predict`: the class of a held-out example (its index) or of one
    example given as comma-separated numbers."""
    from tfdist.predict import classify

    return classify(model, inputs, split_arrays(cfg, "test"), "synthetic_cnn")


def build_dataset(cfg, split):
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(split_arrays(cfg, split))
