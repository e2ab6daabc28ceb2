"""TEMPLATE: copy this file to start a recipe; every member tfdist reads is here.

    cp recipes/TEMPLATE.py my_model.py     # then edit; run it from that directory with:
    python -m tfdist.train my_model --epochs 2
    python -m tfdist.launch -n 2 -- python -m tfdist.train my_model --strategy multi_worker
    python -m tfdist.predict runs/my_model/single 0.5,-1,2,0,0,0,0,0,0,0,0,0,0,0,0,1  # its class

A recipe says WHAT to train; tfdist decides HOW (strategy, sharding, batching,
backups, chief-only writes). So a recipe never builds a strategy, never
batches or shards its data and never writes into the model dir itself.
Import Keras and TensorFlow inside the functions: tfdist loads the recipe to
check your flags before TensorFlow starts. Required: DEFAULTS, build_model,
build_dataset, and compile_kwargs (the loss) unless train_step computes
one. Optional: check_config, build_optimizer, callbacks, train_step, predict
(delete the ones you do not need; tfdist's defaults take over), and
distribution (commented out at the end: it replaces --strategy).

This one learns a noisy linear 4-class problem it generates (no download).
"""

from tfdist.errors import ConfigError  # pure Python: no TensorFlow
from tfdist.option import Option

DEFAULTS = dict(
    # Framework options you want different by default (any `--help` option):
    epochs=3,
    global_batch_size=64,
    learning_rate=0.1,
    # Your own options, set with --num-examples 4096 etc. An Option gives the meaning
    # and range that `--help` shows and tfdist checks before TensorFlow starts; a plain
    # value (like num_classes) is typed by its default and unchecked.
    num_examples=Option(2048, "training examples generated (1/4 as many to test)", ge=4),
    num_features=Option(16, "input features", ge=1),
    num_classes=4,
    hidden_units=Option(32, "units of the hidden layer", ge=1),
)


def check_config(cfg):
    """Optional: checks of your options that need no TensorFlow (a data dir holds
    its files, two sizes agree). tfdist runs it before TensorFlow starts and before
    it writes anything; raise ConfigError, printed as one line (exit 2)."""
    if cfg["num_classes"] < 2:
        raise ConfigError(f"TEMPLATE: num_classes must be at least 2. "
                          f"Received: {cfg['num_classes']}.")


def build_model(cfg):
    """An uncompiled Keras model (tfdist builds it under the strategy's scope)."""
    import keras

    return keras.Sequential([
        keras.Input((cfg["num_features"],)),
        keras.layers.Dense(cfg["hidden_units"], activation="relu"),
        keras.layers.Dense(cfg["num_classes"]),
    ], name="template")


def build_dataset(cfg, split):
    """UNBATCHED (features, label) examples of "train" or "test", the same on every
    worker: tfdist batches at --global-batch-size and gives each replica its part."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)  # the same problem for both splits
    weights = rng.normal(size=(cfg["num_features"], cfg["num_classes"]))
    n = cfg["num_examples"] if split == "train" else cfg["num_examples"] // 4
    x = np.random.default_rng(1 if split == "train" else 2).normal(
        size=(n, cfg["num_features"])).astype("float32")
    y = np.argmax(x @ weights + 0.1 * rng.normal(size=(n, cfg["num_classes"])), axis=1)
    return tf.data.Dataset.from_tensor_slices((x, y.astype("int32")))


def compile_kwargs(cfg):
    """Loss and metrics for model.compile (the optimizer comes from build_optimizer)."""
    import keras

    return dict(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"])


def build_optimizer(cfg, learning_rate):
    """The optimizer. `learning_rate` is --learning-rate after --lr-scaling.
    Without this function tfdist builds one from --optimizer, --momentum,
    --clipnorm, --accumulate and --warmup-steps."""
    import keras

    return keras.optimizers.SGD(learning_rate, momentum=0.5)


def callbacks(cfg):
    """Extra Keras callbacks for fit. They run on EVERY worker: print only where
    cfg["is_chief"], and write files through cfg["writer"] (the run's chief-only
    writer: cfg["writer"].write_text("notes.txt", text) writes on the chief,
    atomically, and nothing elsewhere; tfdist's own backups, metrics.json and
    history.csv go through it too)."""
    import keras

    class EpochNote(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if cfg["is_chief"]:
                print(f"TEMPLATE: epoch {epoch + 1} done, loss {logs['loss']:.4f}", flush=True)

    return [EpochNote()]


def train_step(model, data):
    """One training step, as the body of Keras 3's `Model.train_step(self, data)`
    (the Keras guide "Customizing what happens in fit()"). It runs on every replica
    inside fit, and `model.optimizer.apply` all-reduces the gradients across
    replicas. This one is Keras's step plus a metric: the gradient's global norm."""
    import tensorflow as tf

    x, y = data
    with tf.GradientTape() as tape:
        y_pred = model(x, training=True)
        # Divided by the replica count under tf.distribute (the replicas' gradients are summed).
        loss = model.compute_loss(x=x, y=y, y_pred=y_pred, training=True)
        scaled = model.optimizer.scale_loss(loss)  # loss scaling under mixed_float16
    grads = tape.gradient(scaled, model.trainable_variables)
    model.optimizer.apply(grads, model.trainable_variables)
    replicas = tf.distribute.get_replica_context().num_replicas_in_sync
    logs = {}
    for metric in model.metrics:
        if metric.name == "loss":
            metric.update_state(loss * replicas)  # report the mean loss, as Keras does
        else:
            metric.update_state(y, y_pred)
        result = metric.result()
        logs.update(result if isinstance(result, dict) else {metric.name: result})
    return {**logs, "grad_norm": tf.linalg.global_norm(grads)}


def predict(model, inputs, cfg):
    """What `python -m tfdist.predict RUN_DIR INPUT...` prints, one line per INPUT.

    `model` is the run's model.keras (loaded without compiling), `inputs` the
    INPUT strings as typed, `cfg` the run's configuration (its options as it
    trained). Return one printable result per input. Raise ConfigError for an
    input you cannot read: the command prints it as one line and exits 2.
    This one reads num_features comma-separated numbers and returns the class."""
    import numpy as np

    rows = []
    for text in inputs:
        try:
            row = [float(v) for v in text.split(",")]
        except ValueError:
            row = []
        if len(row) != cfg["num_features"]:
            raise ConfigError(f"TEMPLATE: an input is {cfg['num_features']} comma-separated "
                              f"numbers. Received: {text!r}.")
        rows.append(row)
    logits = model.predict(np.array(rows, dtype="float32"), verbose=0)
    return [str(int(c)) for c in np.argmax(logits, axis=1)]


# Optional, in Keras's terms: a keras.distribution in place of --strategy and
# --tensor-parallel (`--devices N` says how many devices list_devices() shows).
# DataParallel becomes mirrored (multi_worker over several processes); a LayoutMap
# (ModelParallel) on a (1, N) mesh becomes --tensor-parallel N, and must split
# exactly the feed-forward Dense pairs (docs/keras_distribution.md).
#
# def distribution(cfg):
#     import keras
#
#     return keras.distribution.DataParallel(devices=keras.distribution.list_devices())
