"""Test worker: mixed_float16 with a sharded optimizer, where one worker alone both
reads the batch that overflows and owns every weight whose gradient does.

    python zero_loss_scale.py STRATEGY OUT_DIR      (TF_CONFIG set by tfdist.launch)

The model has two branches with their own outputs and losses: `a` (a Dense with
a bias) and `b` (a Dense without one, on inputs of 6e4 in worker 1's rows of the
second step, so its float16 gradient overflows at Keras's initial loss scale,
and only its). Under `--shard-optimizer-state` on 2 workers the weights are
owned by size, `a`'s by worker 0 and `b`'s by worker 1
(`tfdist.zero.partition.owners`), so worker 0 reads no overflowing row and
owns no overflowing weight: the skip has to reach it from worker 1. The job trains the
same model three times from the same start, unsharded, then at `--shard optimizer`
and at `--shard gradients` (the hooks' `shard`), and a fourth time at `--shard
parameters` (each worker holding rows of every weight), 3 steps of Adam at global batch 8;
writes
OUT_DIR/worker{R}.npz: each run's weights, loss scale, inner iterations and this
worker's bytes of sharded slots; and the parameters run's model, `dist.save`d, as
OUT_DIR/parameters.keras.
"""

import os
import sys

import numpy as np


def _data():
    x = np.random.default_rng(0).uniform(-1, 1, (24, 4)).astype(np.float32)
    # Step 2, worker 1's half of the global batch (each worker reads a contiguous
    # half): only worker 1's local gradient of b overflows, and only worker 1 owns b.
    x[12:16, 2:] = 6e4
    y = np.random.default_rng(1).uniform(-1, 1, (24, 6)).astype(np.float32)
    return x, y


def main():
    strategy, out = sys.argv[1], sys.argv[2]
    import tfdist

    dist = tfdist.setup(strategy, threads=1)
    import keras
    import tensorflow as tf

    from tfdist.zero.optimizer import is_shard_slot, variable_bytes

    tf.config.experimental.enable_op_determinism()
    keras.mixed_precision.set_global_policy("mixed_float16")
    x, y = _data()
    examples = tf.data.Dataset.from_tensor_slices(((x[:, :2], x[:, 2:]), (y[:, :3], y[:, 3:])))
    result = {}
    from tfdist.zero import parameters

    runs = [("whole", "none"), ("sharded", "optimizer"), ("gradients", "gradients"),
            ("parameters", "parameters")]
    for key, level in runs:
        dist.hooks.shard = level
        with dist.scope():
            keras.utils.set_random_seed(0)
            xa, xb = keras.Input((2,), name="xa"), keras.Input((2,), name="xb")
            model = dist.model(keras.Model([xa, xb], [
                keras.layers.Dense(3, name="a")(xa),
                keras.layers.Dense(3, use_bias=False, name="b")(xb)]))
            model.compile(optimizer=dist.optimizer(keras.optimizers.Adam(0.01)),
                          loss=["mse", "mse"], **dist.compile_kwargs())
        model.fit(dist.shard(examples, 8, repeat=False), epochs=1, verbose=0,
                  callbacks=dist.callbacks())
        lso = model.optimizer
        inner = lso.inner_optimizer
        result[f"{key}_scale"] = float(lso.dynamic_scale.numpy())
        result[f"{key}_iterations"] = int(inner.iterations.numpy())
        result[f"{key}_slot_bytes"] = sum(variable_bytes(v) for v in inner.variables
                                          if is_shard_slot(v))
        for v in model.weights:  # a split weight gathered whole (every worker, in order)
            result[f"{key}:{v.path}"] = (np.asarray(v.numpy()) if parameters.rows_of(v) is None
                                         else v._tfdist_split.gather(v))
        if level == "parameters":  # the chief writes it whole, as the workers send its rows
            dist.save(model, os.path.join(out, "parameters.keras"))
    np.savez(os.path.join(out, f"worker{dist.rank}.npz"), **result)
    print(f"worker {dist.rank} done", flush=True)


if __name__ == "__main__":
    main()
