"""One shm rank training under mixed_float16 where rank 1 overflows at step 2.

    python shm_loss_scale.py MODE OUT_DIR      (TF_CONFIG set by tfdist.launch)

MODE "tfdist": the optimizer from the trainer's shm hooks (ranks agree on
skipping). MODE "keras": Keras's own LossScaleOptimizer, which `compile` adds
(each rank decides alone). Writes OUT_DIR/rank{R}.npz: weights, the loss
scale and the inner optimizer's iterations.
"""

import os
import sys

import numpy as np


def main():
    mode, out = sys.argv[1], sys.argv[2]
    import keras

    from tfdist import shm
    from tfdist.cluster import detect
    from tfdist.strategies import shm as shm_adapter

    cluster = detect()
    shm.init_from_cluster(cluster, timeout_s=20)
    keras.mixed_precision.set_global_policy("mixed_float16")
    keras.utils.set_random_seed(cluster.worker_index)  # different inits: broadcast fixes them
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    base = keras.optimizers.SGD(0.1)
    if mode == "tfdist":
        optimizer = shm_adapter.ShmHooks(cluster).wrap_optimizer(base)
    else:
        optimizer = shm.DistributedOptimizer(base)
    model.compile(optimizer=optimizer, loss="mse", jit_compile=False)
    # Small inputs: at the initial scale 2**15 only the 6e4 batch overflows.
    x = np.full((12, 4), 0.01 * (cluster.worker_index + 1), np.float32)
    if cluster.worker_index == 1:
        x[4:8] = 6e4  # batch 2: float16 overflow in the forward pass -> non-finite gradients
    y = np.zeros((12, 3), np.float32)
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0,
              callbacks=[shm.BroadcastInitialState()])
    lso = model.optimizer
    np.savez(os.path.join(out, f"rank{cluster.worker_index}.npz"),
             scale=float(lso.dynamic_scale.numpy()),
             iterations=int(lso.inner_optimizer.iterations.numpy()),
             lso_class=type(lso).__module__ + "." + type(lso).__name__,
             **{f"w{i}": np.asarray(w) for i, w in enumerate(model.get_weights())})
    print(f"rank {cluster.worker_index} done", flush=True)


if __name__ == "__main__":
    main()
