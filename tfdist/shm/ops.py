"""TensorFlow side of the shared-memory engine: an allreduce op and the optimizer."""

from __future__ import annotations

import dataclasses

from tfdist import allreduce_optimizer
from tfdist.buckets import bucket_bytes as _bytes_of, overlap_buckets
from tfdist.shm import runtime
from tfdist.shm.comm import disjoint, fusion_buckets


def allreduce(tensors, average: bool = True, bucket_bytes: int = 0):
    """Allreduces a list of dense tensors (eager or inside tf.function).

    With `bucket_bytes` 0 every tensor goes through one `tf.numpy_function`.
    Otherwise the tensors are cut into buckets of about that many bytes from
    the end of the list (`tfdist.buckets.overlap_buckets`): gradients, made in
    reverse layer order, then start their all-reduce while the backward pass
    still computes the earlier layers'. Each bucket is one numpy_function, and
    each waits for the one before it (a control dependency), so every rank
    reduces the buckets in the same order whatever order TensorFlow schedules
    ops in. Inputs are read in place, and results are written into buffers
    TensorFlow allocated (`Empty` tensors passed in and returned): a fresh numpy
    array returned by a numpy_function is copied once more by TensorFlow, one
    of these is not (1.2 ms a step for wide_mlp's 19 MB of gradients).

    Within a bucket, small tensors are fused (`fusion_buckets` with the
    communicator's threshold, read when the function is traced): each fusion
    is concatenated in the graph and split back after (a split along the
    first axis is free), because every tensor crossing a numpy_function costs
    Python work that 200 gradients of 4-64 KB notice (4x slower than one
    tensor of the same total, measured by `bench allreduce`).

    Args:
        tensors: Dense tensors, the same shapes and dtypes on every rank.
        average: Mean instead of sum.
        bucket_bytes: Overlap buckets' size in bytes; 0: one all-reduce.

    Returns:
        The reduced tensors, with the inputs' shapes.
    """
    import tensorflow as tf

    comm = runtime.communicator()
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors or comm.size == 1:
        return tensors
    out = [None] * len(tensors)
    previous = []
    for bucket in overlap_buckets([_static_nbytes(t, comm) for t in tensors], bucket_bytes):
        reduced = _reduce_fused(comm, [tensors[i] for i in bucket], average, after=previous)
        for i, r in zip(bucket, reduced):
            out[i] = r
        previous = reduced
    return out


def _reduce_fused(comm, tensors, average: bool, after=()):
    """One numpy_function all-reducing `tensors`, small ones fused, after the ops in `after`."""
    import tensorflow as tf

    buckets = fusion_buckets([(t.dtype.as_numpy_dtype, _static_nbytes(t, comm)) for t in tensors],
                             comm.fusion_threshold_bytes)
    flat = [tensors[b[0]] if len(b) == 1 else
            tf.concat([tf.reshape(tensors[i], [-1]) for i in b], 0) for b in buckets]
    reduced = _reduce(comm, flat, average, after)
    out = [None] * len(tensors)
    for bucket, r in zip(buckets, reduced):
        if len(bucket) == 1:
            out[bucket[0]] = r
            continue
        parts = tf.split(r, [tensors[i].shape.num_elements() for i in bucket])
        for i, part in zip(bucket, parts):
            out[i] = tf.reshape(part, tensors[i].shape)
    return out


def _static_nbytes(t, comm) -> int:
    """Bytes of a tensor of static shape; others are never fused (threshold or more)."""
    if t.shape.is_fully_defined():
        return t.shape.num_elements() * t.dtype.size
    return max(1, comm.fusion_threshold_bytes)


def _reduce(comm, tensors, average: bool, after=()):
    """One numpy_function all-reducing `tensors` into buffers TensorFlow allocated,
    run only after the ops of the tensors in `after` (the previous bucket's)."""
    import tensorflow as tf

    n = len(tensors)
    buffers = [tf.raw_ops.Empty(shape=tf.shape(t), dtype=t.dtype) for t in tensors]

    def reduce(*arrays):
        inputs, outs = list(arrays[:n]), list(arrays[n:])
        # Only ever write into buffers that are private to this op: if TensorFlow
        # shared one (it must not, Empty is not deduplicated), allocate instead.
        if not (all(o.flags.writeable and o.flags.c_contiguous for o in outs)
                and disjoint(inputs + outs)):
            outs = None
        return comm.allreduce(inputs, average=average, out=outs)

    with tf.control_dependencies(list(after)):
        outs = tf.numpy_function(reduce, tensors + buffers, [t.dtype for t in tensors],
                                 stateful=True, name="tfdist_shm_allreduce")
    for out, t in zip(outs, tensors):
        out.set_shape(t.shape)
    return list(outs)


def reduce_scatter(parts, rank: int, average: bool = True):
    """Part `rank` of `parts` reduced over the ranks, on this rank (flat).

    One numpy_function (`Communicator.reduce_scatter`) reading every part in
    place and writing into a buffer TensorFlow allocated. Every rank calls it
    with the same part sizes, in the same order (`tfdist.zero.scatter`).

    Args:
        parts: One dense tensor (static shape, one dtype) or None per rank: this
            rank's contribution to each rank's result.
        rank: This rank.
        average: Mean instead of sum.

    Returns:
        The reduced part `rank`, flat (a 0-size tensor when it is None).
    """
    import tensorflow as tf

    comm = runtime.communicator()
    index = [q for q, p in enumerate(parts) if p is not None]
    dtype = parts[index[0]].dtype
    size = 0 if parts[rank] is None else parts[rank].shape.num_elements()
    buffer = tf.raw_ops.Empty(shape=[size], dtype=dtype)

    def scatter(*arrays):
        given = [None] * len(parts)
        for q, a in zip(index, arrays[:-1]):
            given[q] = a
        out = arrays[-1]
        target = out if out.flags.writeable and out.flags.c_contiguous else None
        return comm.reduce_scatter(given, out=target, average=average)

    out = tf.numpy_function(scatter, [parts[q] for q in index] + [buffer], dtype,
                            stateful=True, name="tfdist_shm_reduce_scatter")
    out.set_shape([size])
    return out


def all_gather(part):
    """Every rank's `part` (dense, one static shape on every rank) concatenated in rank
    order, flat: one numpy_function (`Communicator.all_gather`) writing into a buffer
    TensorFlow allocated. Every rank calls it in the same order (`tfdist.zero.parameters`).
    """
    import tensorflow as tf

    comm = runtime.communicator()
    size = comm.size * part.shape.num_elements()
    buffer = tf.raw_ops.Empty(shape=[size], dtype=part.dtype)

    def gather(x, out):
        target = out if out.flags.writeable and out.flags.c_contiguous else None
        return comm.all_gather(x, out=target)

    out = tf.numpy_function(gather, [part, buffer], part.dtype, stateful=True,
                            name="tfdist_shm_all_gather")
    out.set_shape([size])
    return out


def all_true(flag):
    """True on every rank when the scalar boolean `flag` is True on all of them."""
    import tensorflow as tf

    comm = runtime.communicator()
    (total,) = allreduce([tf.cast(flag, tf.float32)], average=False)
    return total > comm.size - 0.5


@dataclasses.dataclass(frozen=True)
class _GradientAllreduce:
    """Averages a list of gradients (None kept, IndexedSlices made dense).

    Frozen (hashable, compared by value): it is the class attribute of the
    distributed optimizer class, one class per set of options.
    """

    bucket_bytes: int = 0

    def __call__(self, grads):
        import tensorflow as tf

        index = [i for i, g in enumerate(grads) if g is not None]
        dense = [tf.convert_to_tensor(grads[i]) for i in index]
        out = list(grads)
        for i, g in zip(index, allreduce(dense, average=True, bucket_bytes=self.bucket_bytes)):
            out[i] = g
        return out


def DistributedOptimizer(optimizer, *, backward_passes_per_step: int = 1,
                         compression: str = "none", bucket_mb: float = 0.0):
    """Wraps a Keras 3 optimizer so gradients are averaged across the shm ranks first.

    Compile the model with `jit_compile=False`: the allreduce is a
    `tf.numpy_function`, which XLA cannot compile.

    Args:
        optimizer: An unbuilt `keras.optimizers.Optimizer`.
        backward_passes_per_step: Accumulate this many local gradients and
            allreduce and apply their mean once.
        compression: "none", "fp16" or "bf16": floating gradients are cast
            for the all-reduce and back (see `tfdist.compression`).
        bucket_mb: All-reduce the gradients in buckets of about this many MB,
            the last layers' first, each as soon as its gradients exist, so
            communication overlaps the backward pass; 0 (the default, measured
            faster on one host: docs/benchmarks.md): one all-reduce after it
            (see `allreduce`).

    Returns:
        The distributed optimizer (see `tfdist.allreduce_optimizer.wrap`).

    Raises:
        ConfigError: for an unknown compression.
        ValueError: for a negative `bucket_mb`.
    """
    if not isinstance(bucket_mb, (int, float)) or bucket_mb < 0:
        raise ValueError(f"bucket_mb must be a number >= 0 (0: one all-reduce). Received: "
                         f"bucket_mb={bucket_mb!r}.")
    spec = _GradientAllreduce(_bytes_of(bucket_mb))
    return allreduce_optimizer.with_compression(
        allreduce_optimizer.wrap(optimizer, spec, backward_passes_per_step),
        compression)
