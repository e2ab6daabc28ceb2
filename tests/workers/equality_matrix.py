"""Test worker: one strategy trains every cell of the equality matrix in turn.

    python tests/workers/equality_matrix.py STRATEGY OUT_DIR [--devices N]
        [--microbatches M] [--models dense,attention] [--variants CELL,...] [--steps S]

A cell is (model, optimizer): a dense MLP; a small Transformer-style model
(Embedding with repeated tokens, so its gradient is an IndexedSlices with
repeated rows; MultiHeadAttention; LayerNormalization); or a chain with an
Embedding and a layer without weights (for model_parallel and pipeline).
Each is trained for S steps at global batch 32 with `fit`, from the same
seed, under STRATEGY through `tfdist.setup()`, the path a user's own script
takes: every model in `--models` with every optimizer, then each variant,
`model:optimizer:what` with what one of `acc2` (2 accumulated half batches,
the same math as one full batch), `fp16`, `bf16` (gradient compression) or
`upstream` (Keras's own sparse updates: the negative control). One launched
job pays TensorFlow's start-up once for every cell.

Each worker writes OUT_DIR/worker{RANK}/{model}-{optimizer}[-{what}].npz with
the trained weights (keys are the variables' paths), or a `.refused` file
with the error's one line when the strategy refuses the model before
training, and {model}.init with each model's initial weights.
"""

from __future__ import annotations

import argparse
import contextlib
import os

import numpy as np

GLOBAL_BATCH = 32
VOCAB, SEQ, CLASSES = 50, 8, 4
# The optimizers of the matrix: what `--optimizer` offers and is deterministic.
# sgd with momentum stands for sgd; multioptimizer needs per-variable config.
OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop", "adagrad", "adadelta", "adamax", "nadam",
              "ftrl", "lamb", "lion", "adafactor")
MODELS = ("dense", "attention", "chain")
# Adadelta starts with steps of about sqrt(epsilon) x lr, hence its large rate.
LEARNING_RATES = {"sgd": 0.3, "adadelta": 20.0, "adagrad": 0.3, "ftrl": 0.3, "adafactor": 0.5}


def make_optimizer(name, accumulate=1):
    """The optimizer of a cell (learning rates that move the weights in a few steps)."""
    from tfdist import optim

    # Rates at which every compared weight moves well past the tolerance in a few
    # steps (the test checks it): the adaptive optimizers' steps are about lr each.
    kwargs = {"learning_rate": LEARNING_RATES.get(name, 0.01)}
    if name == "sgd":
        kwargs["momentum"] = 0.9
    if accumulate > 1:
        kwargs["gradient_accumulation_steps"] = accumulate
    return optim.optimizer_classes()[name](**kwargs)


def build_model(kind):
    """The cell's model, from seed 0 (the same initial weights on every process)."""
    import keras

    keras.utils.set_random_seed(0)
    if kind == "dense":
        inputs = keras.Input((16,), name="x")
        h = keras.layers.Dense(32, activation="relu", name="d0")(inputs)
        h = keras.layers.Dense(32, activation="tanh", name="d1")(h)
        return keras.Model(inputs, keras.layers.Dense(CLASSES, name="out")(h), name="dense")
    inputs = keras.Input((SEQ,), dtype="int32", name="tokens")
    h = keras.layers.Embedding(VOCAB, 16, name="embed")(inputs)
    if kind == "chain":  # Embedding -> pooling (no weights) -> Dense -> Dense
        h = keras.layers.GlobalAveragePooling1D(name="pool")(h)
        h = keras.layers.Dense(16, activation="relu", name="d1")(h)
        return keras.Model(inputs, keras.layers.Dense(CLASSES, name="out")(h), name="chain")
    a = keras.layers.MultiHeadAttention(2, 8, name="mha")(h, h)
    h = keras.layers.LayerNormalization(name="ln")(keras.layers.Add(name="res")([h, a]))
    h = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    return keras.Model(inputs, keras.layers.Dense(CLASSES, name="out")(h), name="attention")


def dataset(kind, n):
    """`n` unbatched examples, the same on every process (tokens repeat within a batch)."""
    import tensorflow as tf

    rng = np.random.default_rng(1)
    y = rng.integers(0, CLASSES, n).astype("int32")
    if kind == "dense":
        x = rng.normal(size=(n, 16)).astype("float32")
    else:  # few tokens, so every batch looks up the same rows many times
        x = rng.integers(0, 12, size=(n, SEQ)).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y))


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("strategy")
    parser.add_argument("out_dir")
    parser.add_argument("--devices", type=int, default=None)
    parser.add_argument("--microbatches", type=int, default=1)
    parser.add_argument("--schedule", default="gpipe")
    parser.add_argument("--models", default="dense,attention")
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    parser.add_argument("--variants", default="")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args(argv)

    import tfdist

    dist = tfdist.setup(args.strategy, devices=args.devices, threads=1,
                        microbatches=args.microbatches, schedule=args.schedule)
    import tensorflow as tf

    tf.config.experimental.enable_op_determinism()
    cells = [(m, o, "") for m in args.models.split(",") for o in args.optimizers.split(",")]
    cells += [tuple(v.split(":")) for v in args.variants.split(",") if v]
    out = os.path.join(args.out_dir, f"worker{dist.rank}")
    os.makedirs(out, exist_ok=True)
    for kind in args.models.split(","):  # the start, to show that training moved every weight
        with open(os.path.join(out, f"{kind}.init"), "wb") as f:
            np.savez(f, **{v.path: v.numpy() for v in build_model(kind).weights})
    for kind, name, what in cells:
        stem = os.path.join(out, "-".join(p for p in (kind, name, what) if p))
        with variant(dist, what):
            train_cell(dist, kind, name, args.steps, 2 if what == "acc2" else 1, stem)
    print(f"MATRIX DONE {dist.name} rank {dist.rank} cells {len(cells)}", flush=True)


def train_cell(dist, kind, name, steps, accumulate, stem):
    """Trains one cell and writes STEM.npz (or STEM.refused with the refusal's line)."""
    import keras

    from tfdist.errors import ConfigError

    with dist.scope():
        try:
            model = dist.model(build_model(kind))
        except ConfigError as e:
            with open(stem + ".refused", "w") as f:
                f.write(str(e))
            return
        model.compile(optimizer=dist.optimizer(make_optimizer(name, accumulate)),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      **dist.compile_kwargs())
    # k accumulated batches of B/k are one batch of B: the same examples, the same step.
    data = dist.shard(dataset(kind, GLOBAL_BATCH * steps), GLOBAL_BATCH // accumulate,
                      repeat=False)
    model.fit(data, epochs=1, callbacks=dist.callbacks(), verbose=0, shuffle=False)
    np.savez(stem + ".npz", **{v.path: v.numpy() for v in model.weights})


@contextlib.contextmanager
def variant(dist, what):
    """Gradient compression or Keras's own sparse updates for one cell, restored after."""
    from tfdist.compat import keras_grad_reduction, keras_sparse_duplicates

    if what in ("fp16", "bf16"):
        # Where each engine reads --grad-compression: MirroredStrategy's patch (at
        # trace time), the process-replica engines' hooks (at optimizer wrap time).
        keras_grad_reduction.set_compression(what)
        hooks_had = getattr(dist.hooks, "grad_compression", None)
        if hooks_had is not None:
            dist.hooks.grad_compression = what
    elif what == "upstream":
        keras_sparse_duplicates.revert()
    try:
        yield
    finally:
        if what in ("fp16", "bf16"):
            keras_grad_reduction.set_compression("none")
            if hooks_had is not None:
                dist.hooks.grad_compression = hooks_had
        elif what == "upstream":
            keras_sparse_duplicates.apply()


if __name__ == "__main__":
    main()
