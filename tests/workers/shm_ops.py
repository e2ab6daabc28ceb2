"""One shm rank all-reducing a mix of tensors through the TensorFlow op (fused and not).

    python shm_ops.py OUT_DIR      (TF_CONFIG set by tfdist.launch)

Rank r's tensors are `tensors(r)`; with a 4 KB fusion threshold the small
ones are concatenated in the graph and the 40 KB one goes alone. Writes
OUT_DIR/rank{R}.npz with the sums (tf.function) and means (eager).
"""

import os
import sys

import numpy as np


def tensors(rank):
    """Small float32s of several shapes (a scalar, an empty one), int32s, one 40 KB float32."""
    rng = np.random.default_rng(rank)
    shapes = [(3, 4), (), (7,), (0, 3), (2, 2, 5), (10_000,), (1,)]
    out = {f"f32_{i}": rng.integers(-50, 50, s).astype(np.float32) / 4 for i, s in enumerate(shapes)}
    out["i32_a"] = rng.integers(-9, 9, (5,)).astype(np.int32)
    out["i32_b"] = rng.integers(-9, 9, (2, 3)).astype(np.int32)
    return out


def main():
    out_dir = sys.argv[1]
    import tensorflow as tf

    from tfdist import shm
    from tfdist.cluster import detect

    cluster = detect()
    comm = shm.init_from_cluster(cluster, timeout_s=60, fusion_threshold_bytes=4096)
    xs = tensors(cluster.worker_index)
    names = sorted(xs)
    inputs = [tf.constant(xs[k]) for k in names]
    calls = comm._calls  # noqa: SLF001 - counts the buckets the op reduced
    sums = tf.function(lambda ts: shm.allreduce(ts, average=False))(inputs)
    buckets = comm._calls - calls  # noqa: SLF001
    means = shm.allreduce(inputs, average=True)
    result = {"buckets": np.array(buckets)}
    for k, s, m in zip(names, sums, means):
        assert tuple(s.shape) == xs[k].shape and tuple(m.shape) == xs[k].shape, k
        result[f"sum_{k}"], result[f"mean_{k}"] = s.numpy(), m.numpy()
    np.savez(os.path.join(out_dir, f"rank{cluster.worker_index}.npz"), **result)


if __name__ == "__main__":
    main()
