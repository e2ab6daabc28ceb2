"""`DistributedOptimizer`: any Keras 3 optimizer, gradients allreduced first.

Why not `horovod.tensorflow.keras.DistributedOptimizer`: it averages in
`_aggregate_gradients`, a Keras 2 (optimizer_v2) hook that Keras 3 never
calls, so once its construction error (horovod#4290) is patched it trains
with each rank's own gradients and says nothing (see
`tfdist.compat.horovod_keras` and its test).

Where the allreduce goes: see `tfdist.allreduce_optimizer` (shared with the
shared-memory engine).
"""

from __future__ import annotations

from tfdist import allreduce_optimizer

OPS = ("average", "sum")
COMPRESSIONS = ("none", "fp16")


class _GradientAllreduce:
    """Allreduces a list of gradients (dense tensors or IndexedSlices)."""

    def __init__(self, op: str, compression: str, sparse_as_dense: bool):
        self.op, self.compression, self.sparse_as_dense = op, compression, sparse_as_dense

    def __call__(self, grads):
        import tensorflow as tf

        from tfdist.horovod import runtime

        hvd = runtime.hvd()
        op = {"average": hvd.Average, "sum": hvd.Sum}[self.op]
        compression = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}[
            self.compression]
        out = []
        for i, g in enumerate(grads):
            if g is None:
                out.append(g)
                continue
            if self.sparse_as_dense and isinstance(g, tf.IndexedSlices):
                g = tf.convert_to_tensor(g)
            # IndexedSlices stay sparse: horovod allgathers values and indices.
            # Explicit names keep eager (custom-loop) calls matched across ranks.
            out.append(hvd.allreduce(g, op=op, compression=compression,
                                     name=f"tfdist_grad_{i}"))
        return out


def DistributedOptimizer(optimizer, *, op: str = "average", compression: str = "none",
                         backward_passes_per_step: int = 1, sparse_as_dense: bool = False):
    """Wraps a Keras 3 optimizer so that gradients are allreduced before they apply.

    Modeled on Horovod's own `DistributedOptimizer`, for Keras 3. The returned
    optimizer is a new instance of a subclass of `type(optimizer)`, built from
    `optimizer.get_config()` (so wrap before training, as with Horovod).

    Args:
        optimizer: An unbuilt `keras.optimizers.Optimizer`.
        op: "average" (data parallelism: the mean gradient of the global
            batch) or "sum".
        compression: "none", or "fp16" to halve the bytes sent (values are
            cast to float16 for the allreduce and back).
        backward_passes_per_step: Accumulate this many local gradients
            (Keras 3's `gradient_accumulation_steps`) and allreduce and apply
            their mean once; the optimizer updates every k-th call.
        sparse_as_dense: Convert IndexedSlices (embedding gradients) to dense
            tensors before the allreduce; otherwise they are allgathered.

    Returns:
        The distributed optimizer.

    Raises:
        ValueError: for an unknown op or compression, a bad
            `backward_passes_per_step`, an optimizer that is already built or
            already distributed, or one whose own accumulation disagrees.
    """
    if op not in OPS:
        raise ValueError(f"op must be one of {list(OPS)}. Received: op={op!r}.")
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {list(COMPRESSIONS)}. "
                         f"Received: compression={compression!r}.")
    return allreduce_optimizer.wrap(optimizer, _GradientAllreduce(op, compression, sparse_as_dense),
                                    backward_passes_per_step)
