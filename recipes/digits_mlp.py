"""digits_mlp: an MLP on the UCI handwritten digits (8x8 images, 10 classes).

The data ships inside scikit-learn (`sklearn.datasets.load_digits`, 1,797
images), so nothing is downloaded. With `--data-dir DIR` the recipe reads
TFRecord shards instead (`DIR/train-*.tfrecord`, `DIR/test-*.tfrecord`),
which exercises FILE sharding; write them with:

    python recipes/digits_mlp.py DIR [NUM_FILES]

Launch:
    python -m tfdist.train digits_mlp                                  # one machine
    python -m tfdist.train digits_mlp --strategy mirrored --devices 2  # 2 replicas
    python -m tfdist.launch -n 2 -- python -m tfdist.train digits_mlp --strategy multi_worker
    python -m tfdist.launch --ps 1 --workers 2 -- python -m tfdist.train digits_mlp --strategy parameter_server

Use the trained model: `python -m tfdist.predict runs/digits_mlp/single 0 1` prints the
digit of held-out images 0 and 1 (an input may also be 64 comma-separated pixels in [0, 1]).
"""

import os
import sys

from tfdist.option import Option

DEFAULTS = dict(
    epochs=10,
    global_batch_size=64,
    learning_rate=0.1,
    hidden_units=Option(64, "units of the hidden layer", ge=1),
    data_dir=Option("", "read TFRecord shards from here instead of scikit-learn's copy"),
    test_fraction=Option(0.2, "fraction of the digits held out for the test split", gt=0, lt=1),
)

NUM_FEATURES = 64
NUM_CLASSES = 10


def load_arrays(test_fraction=0.2, seed=0):
    """Digits as float32 features in [0, 1] and int32 labels, split train/test."""
    import numpy as np

    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError("digits_mlp needs scikit-learn for its bundled data: "
                          "pip install 'tfdist[data]' (or scikit-learn).") from None
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int32")
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return (x[train], y[train]), (x[test], y[test])


def check_config(cfg):
    """Before TensorFlow: a --data-dir holds both splits' TFRecord files."""
    from tfdist import data

    if cfg["data_dir"]:
        for split in ("train", "test"):
            data.tfrecord_files(cfg["data_dir"], split)


def build_model(cfg):
    import keras

    inputs = keras.Input(shape=(NUM_FEATURES,), name="pixels")
    h = keras.layers.Dense(cfg["hidden_units"], activation="relu", name="hidden")(inputs)
    outputs = keras.layers.Dense(NUM_CLASSES, name="logits")(h)
    return keras.Model(inputs, outputs, name="digits_mlp")


def compile_kwargs(cfg):
    import keras

    return dict(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"])


def predict(model, inputs, cfg):
    """`python -m tfdist.predict`: the digit of each input, a held-out image's index
    (printed with its label) or 64 comma-separated pixel values in [0, 1]."""
    from tfdist.predict import classify

    return classify(model, inputs, load_arrays(cfg["test_fraction"])[1], "digits_mlp")


def _parse(record):
    import tensorflow as tf

    spec = {"x": tf.io.FixedLenFeature([NUM_FEATURES], tf.float32),
            "y": tf.io.FixedLenFeature([], tf.int64)}
    ex = tf.io.parse_single_example(record, spec)
    return ex["x"], tf.cast(ex["y"], tf.int32)


def build_dataset(cfg, split):
    import tensorflow as tf

    from tfdist import data

    if cfg["data_dir"]:
        files = data.tfrecord_files(cfg["data_dir"], split)
        ds = tf.data.Dataset.from_tensor_slices(files).interleave(
            tf.data.TFRecordDataset, cycle_length=1, deterministic=True).map(_parse)
        return data.Source(dataset=ds, num_files=len(files))
    train, test = load_arrays(cfg["test_fraction"])
    return tf.data.Dataset.from_tensor_slices(train if split == "train" else test)


def write_tfrecords(data_dir, num_files=4, test_fraction=0.2):
    """Writes the digits as `num_files` TFRecord shards per split.

    Returns:
        {split: number of examples written}.
    """
    import tensorflow as tf

    os.makedirs(data_dir, exist_ok=True)
    written = {}
    for split, (x, y) in zip(("train", "test"), load_arrays(test_fraction)):
        written[split] = len(x)
        for shard in range(num_files):
            path = os.path.join(data_dir, f"{split}-{shard:05d}-of-{num_files:05d}.tfrecord")
            with tf.io.TFRecordWriter(path) as writer:
                for xi, yi in zip(x[shard::num_files], y[shard::num_files]):
                    feature = {
                        "x": tf.train.Feature(float_list=tf.train.FloatList(value=xi)),
                        "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[yi]))}
                    writer.write(tf.train.Example(
                        features=tf.train.Features(feature=feature)).SerializeToString())
    return written


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python recipes/digits_mlp.py DATA_DIR [NUM_FILES]")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    num_files = int(sys.argv[2]) if len(sys.argv) == 3 else 4
    counts = write_tfrecords(sys.argv[1], num_files)
    print(f"wrote {counts['train']} train and {counts['test']} test digits to {sys.argv[1]} "
          f"({num_files} files per split: train-*.tfrecord, test-*.tfrecord); train on them "
          f"with: python -m tfdist.train digits_mlp --data-dir {sys.argv[1]}")
