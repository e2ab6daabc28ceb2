"""Test worker: one strategy trains every cell of the equality matrix in turn.

    python tests/workers/equality_matrix.py STRATEGY OUT_DIR [--devices N]
        [--microbatches M] [--tensor-parallel T] [--models dense,attention]
        [--variants CELL,...] [--steps S] [--shard-optimizer-state | --shard LEVEL]
        [--gather-chunk-elements E]

A cell is (model, optimizer): a dense MLP; a small Transformer-style model
(Embedding with repeated tokens, so its gradient is an IndexedSlices with
repeated rows; MultiHeadAttention; LayerNormalization); or a chain with an
Embedding and a layer without weights (for model_parallel and pipeline).
Each is trained for S steps at global batch 32 with `fit`, from the same
seed, under STRATEGY through `tfdist.setup()`, the path a user's own script
takes: every model in `--models` with every optimizer, then each variant,
`model:optimizer:what` with what one of `acc2` (2 accumulated half batches,
the same math as one full batch), `clip` (global_clipnorm `CLIP`, below the
gradients' norm, so every step is clipped), `fp16`, `bf16` (gradient compression) or
`upstream` (Keras's own sparse updates: the negative control). One launched
job pays TensorFlow's start-up once for every cell.

Every model of `--models` is a tower of one Keras model, so one `fit` per
optimizer trains a whole row of cells (see `build_model`). Each worker writes
OUT_DIR/worker{RANK}/{model}-{optimizer}[-{what}].npz with the trained
weights of each tower (keys are the variables' paths without the model's
prefix; a tensor-parallel model's shards gathered into the plain layers'
weights), or {model}-{optimizer}.refused with the text of the strategy's
refusal; {model}.init with each model's initial weights; and, for a split
model, split.layers naming each layer's class (tensor-parallel or plain); and
state_{models}-{optimizer}[-{what}].state with the row's optimizer-state bytes
(`save_state_bytes`). `--shard A,B` trains every cell at each level in turn (one
start-up), level A's into OUT_DIR-A, B's into OUT_DIR-B.
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
# The `clip` variant's global_clipnorm: below these models' gradient norms in every step.
CLIP = 0.5
LEARNING_RATES = {"sgd": 0.3, "adadelta": 20.0, "adagrad": 0.3, "ftrl": 0.3, "adafactor": 0.5}


def make_optimizer(name, accumulate=1, global_clipnorm=None):
    """The optimizer of a cell (learning rates that move the weights in a few steps)."""
    from tfdist import optim

    # Rates at which every compared weight moves well past the tolerance in a few
    # steps (the test checks it): the adaptive optimizers' steps are about lr each.
    kwargs = {"learning_rate": LEARNING_RATES.get(name, 0.01)}
    if name == "sgd":
        kwargs["momentum"] = 0.9
    if accumulate > 1:
        kwargs["gradient_accumulation_steps"] = accumulate
    if global_clipnorm:
        kwargs["global_clipnorm"] = global_clipnorm
    return optim.optimizer_classes()[name](**kwargs)


def tower(kind):
    """(input, output) of one cell's model, its layers named KIND_..., from its own seed.

    Each tower is seeded alone, so it starts from the same weights whether it
    is trained alone or beside other towers.
    """
    import keras

    keras.utils.set_random_seed(0)
    name = lambda layer: f"{kind}_{layer}"  # noqa: E731
    if kind == "dense":
        inputs = keras.Input((16,), name=name("x"))
        h = keras.layers.Dense(32, activation="relu", name=name("d0"))(inputs)
        h = keras.layers.Dense(32, activation="tanh", name=name("d1"))(h)
        return inputs, keras.layers.Dense(CLASSES, name=name("out"))(h)
    inputs = keras.Input((SEQ,), dtype="int32", name=name("tokens"))
    h = keras.layers.Embedding(VOCAB, 16, name=name("embed"))(inputs)
    if kind == "chain":  # Embedding -> pooling (no weights) -> Dense -> Dense
        h = keras.layers.GlobalAveragePooling1D(name=name("pool"))(h)
        h = keras.layers.Dense(16, activation="relu", name=name("d1"))(h)
        return inputs, keras.layers.Dense(CLASSES, name=name("out"))(h)
    a = keras.layers.MultiHeadAttention(2, 8, name=name("mha"))(h, h)
    h = keras.layers.LayerNormalization(name=name("ln"))(
        keras.layers.Add(name=name("res"))([h, a]))
    h = keras.layers.GlobalAveragePooling1D(name=name("pool"))(h)
    return inputs, keras.layers.Dense(CLASSES, name=name("out"))(h)


def build_model(kinds):
    """One model holding a tower per kind: one `fit` trains every model of a cell's row.

    The towers share no weight and their losses add, so each tower's gradients,
    and with an optimizer that updates each variable on its own (every one here),
    its weights, are those of the tower trained alone.
    """
    import keras

    ends = [tower(kind) for kind in kinds]
    return keras.Model([i for i, _ in ends], [o for _, o in ends], name="_".join(kinds))


def dataset(kinds, n):
    """`n` unbatched examples per kind, the same on every process (tokens repeat in a batch)."""
    import tensorflow as tf

    xs, ys = [], []
    for kind in kinds:
        rng = np.random.default_rng(1)
        ys.append(rng.integers(0, CLASSES, n).astype("int32"))
        if kind == "dense":
            xs.append(rng.normal(size=(n, 16)).astype("float32"))
        else:  # few tokens, so every batch looks up the same rows many times
            xs.append(rng.integers(0, 12, size=(n, SEQ)).astype("int32"))
    return tf.data.Dataset.from_tensor_slices((tuple(xs), tuple(ys)))


def save_split(model, out):
    """OUT/split.layers: "name ClassName" per layer of a split model (tensor-parallel or not)."""
    layers = getattr(model, "pipeline_layers", None)
    if layers is not None:
        with open(os.path.join(out, "split.layers"), "w") as f:
            f.writelines(f"{layer.name} {type(layer).__name__}\n" for layer in layers)


def save_towers(model, kinds, stem):
    """STEM with KIND for OPTIMIZER: writes KIND-REST.npz per tower, keys without the prefix."""
    if hasattr(model, "unsplit"):  # model_parallel, pipeline: the plain model, shards gathered
        from tfdist.model_parallel import surgery

        model = surgery.gather_model(model.unsplit())
    from tfdist.zero import parameters

    # --shard parameters: every worker gathers each split weight whole (all in one order).
    values = {v.path: (v.numpy() if parameters.rows_of(v) is None
                       else v._tfdist_split.gather(v)) for v in model.weights}
    for kind in kinds:
        prefix = f"{kind}_"
        np.savez(stem.format(kind=kind), **{p[len(prefix):]: value
                                            for p, value in values.items() if p.startswith(prefix)})


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("strategy")
    parser.add_argument("out_dir")
    parser.add_argument("--devices", type=int, default=None)
    parser.add_argument("--microbatches", type=int, default=1)
    parser.add_argument("--schedule", default="gpipe")
    parser.add_argument("--tensor-parallel", type=int, default=1)
    parser.add_argument("--models", default="dense,attention")
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    parser.add_argument("--variants", default="")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--bucket-mb", type=float, default=None)
    parser.add_argument("--shard-optimizer-state", action="store_true")
    parser.add_argument("--shard", default=None,
                        help="none, optimizer, gradients or parameters, or several (A,B)")
    parser.add_argument("--gather-chunk-elements", type=int, default=0,
                        help="multi_worker sharding: all_gather pieces this small (0: as is)")
    args = parser.parse_args(argv)
    if args.gather_chunk_elements:  # so these small weights go in several row ranges
        from tfdist.zero import mwms

        mwms.CHUNK_ELEMENTS = args.gather_chunk_elements

    import tfdist

    dist = tfdist.setup(args.strategy, devices=args.devices, threads=1,
                        microbatches=args.microbatches, schedule=args.schedule,
                        tensor_parallel=args.tensor_parallel,
                        **({} if args.bucket_mb is None else {"bucket_mb": args.bucket_mb}),
                        **({"shard_optimizer_state": True} if args.shard_optimizer_state else {}),
                        **({"shard": args.shard.split(",")[0]} if args.shard else {}))
    import tensorflow as tf

    tf.config.experimental.enable_op_determinism()
    kinds = args.models.split(",")
    # A row trains every model with one optimizer in one fit; a variant, one model.
    cells = [(tuple(kinds), o, "") for o in args.optimizers.split(",")]
    cells += [((k,), o, what) for k, o, what in (v.split(":") for v in args.variants.split(",")
                                                if v)]
    levels = args.shard.split(",") if args.shard else [None]
    for level in levels:
        if level is not None:
            dist.hooks.shard = level  # the hooks read it when they wrap and split
        out_dir = args.out_dir if len(levels) == 1 else f"{args.out_dir}-{level}"
        out = os.path.join(out_dir, f"worker{dist.rank}")
        os.makedirs(out, exist_ok=True)
        start = build_model(kinds)  # the start, to show that training moved every weight
        for kind in kinds:
            with open(os.path.join(out, f"{kind}.init"), "wb") as f:
                np.savez(f, **{v.path[len(kind) + 1:]: v.numpy() for v in start.weights
                               if v.path.startswith(f"{kind}_")})
        for row, name, what in cells:
            stem = os.path.join(out, "-".join(p for p in ("{kind}", name, what) if p) + ".npz")
            with variant(dist, what):
                train_cell(dist, row, name, args.steps, 2 if what == "acc2" else 1, stem,
                           CLIP if what == "clip" else None)
    print(f"MATRIX DONE {dist.name} rank {dist.rank} cells {len(cells)}", flush=True)


def train_cell(dist, kinds, name, steps, accumulate, stem, global_clipnorm=None):
    """Trains one row of cells (every model in `kinds`, one optimizer) and saves each tower."""
    import keras

    from tfdist.errors import ConfigError

    with dist.scope():
        try:
            model = dist.model(build_model(kinds))
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
            optimizer = make_optimizer(name, accumulate, global_clipnorm)
            model.compile(optimizer=dist.optimizer(optimizer),
                          loss=[loss] * len(kinds), **dist.compile_kwargs())
        except ConfigError as e:  # the strategy refuses the row: its text, for the test
            for kind in kinds:
                with open(stem.format(kind=kind)[:-len(".npz")] + ".refused", "w") as f:
                    f.write(str(e))
            return
    save_split(model, os.path.dirname(stem))
    # k accumulated batches of B/k are one batch of B: the same examples, the same step.
    data = dist.shard(dataset(kinds, GLOBAL_BATCH * steps), GLOBAL_BATCH // accumulate,
                      repeat=False)
    model.fit(data, epochs=1, callbacks=dist.callbacks(), verbose=0, shuffle=False)
    save_towers(model, kinds, stem)
    row = os.path.basename(stem.format(kind="+".join(kinds)))[:-len(".npz")]
    save_state_bytes(model, os.path.join(os.path.dirname(stem), f"state_{row}.state"))


def save_state_bytes(model, path):
    """PATH (OUT/state_KINDS-OPTIMIZER[-WHAT].state, KINDS joined by +): this worker's
    bytes of sharded optimizer slots, of trainable weights, and its largest weight
    (JSON), to show how a sharded optimizer split its state."""
    import json

    from tfdist.zero import parameters
    from tfdist.zero.optimizer import is_per_worker, variable_bytes

    optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)
    sizes = [variable_bytes(v) for v in model.trainable_variables]
    whole = [int(np.prod(parameters.full_shape(v))) * np.dtype(v.dtype).itemsize
             for v in model.trainable_variables]
    with open(path, "w") as f:
        # At --shard parameters a worker's weights (`held_bytes`) are its rows; slots
        # and accumulators of them are its own (per worker) too.
        json.dump({"slot_bytes": sum(variable_bytes(v) for v in optimizer.variables
                                     if is_per_worker(v)),
                   "weight_bytes": sum(whole), "largest": max(whole),
                   "held_bytes": sum(sizes),
                   "padding_bytes": sum(_padding(v) for v in model.trainable_variables),
                   # whether the gradients were summed onto their owners (tfdist.zero.scatter)
                   "scattered": bool(getattr(optimizer, "_tfdist_partial", False)
                                     or getattr(optimizer, "_tfdist_scatters", False)),
                   "level": getattr(optimizer, "_tfdist_shard_level", "none")}, f)


def _padding(variable) -> int:
    """Bytes of the zero rows padding this worker's share of a split variable."""
    from tfdist.zero import parameters
    from tfdist.zero.optimizer import variable_bytes

    rows = parameters.rows_of(variable)
    if rows is None:
        return 0
    start, stop, per, _ = rows
    return variable_bytes(variable) // per * (per - (stop - start))


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
