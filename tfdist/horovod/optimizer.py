"""`DistributedOptimizer`: any Keras 3 optimizer, gradients allreduced first.

Why not `horovod.tensorflow.keras.DistributedOptimizer`: it averages in
`_aggregate_gradients`, a Keras 2 (optimizer_v2) hook that Keras 3 never
calls, so once its construction error (horovod#4290) is patched it trains
with each rank's own gradients and says nothing (see
`tfdist.compat.horovod_keras` and its test).

Where the allreduce goes: see `tfdist.allreduce_optimizer` (shared with the
shared-memory engine).

Names: Horovod pairs the collectives of different ranks by name. Keras 3
applies gradients inside a name scope of the optimizer's per-process name
(`sgd`, `sgd_1`, ... in creation order; a loaded optimizer keeps its saved
name), so a name scope would differ between ranks that created different
numbers of optimizers, and the job would stall. Every collective here is
named from what is equal on every rank, the optimizer's class (or the given
`name`) and the gradient's position in the optimizer's variable order, and
passes `ignore_name_scope=True`.
"""

from __future__ import annotations

import dataclasses

from tfdist import allreduce_optimizer

OPS = ("average", "sum")
COMPRESSIONS = ("none", "fp16")


@dataclasses.dataclass(frozen=True)
class _GradientAllreduce:
    """Allreduces a list of gradients (dense tensors or IndexedSlices).

    Frozen (hashable, compared by value): it is the class attribute of the
    distributed optimizer class, one class per set of options.
    """

    op: str = "average"
    compression: str = "none"
    sparse_as_dense: bool = False
    prefix: str = ""

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
            name = f"{self.prefix}_grad_{i}"
            if self.sparse_as_dense and isinstance(g, tf.IndexedSlices):
                g = tf.convert_to_tensor(g)
            if isinstance(g, tf.IndexedSlices):
                g = self._sparse(hvd, g, name)
            else:
                g = hvd.allreduce(g, op=op, compression=compression, name=name,
                                  ignore_name_scope=True)
            out.append(g)
        return out

    def _sparse(self, hvd, g, name):
        return sparse_allreduce(hvd, g, name, average=self.op == "average")


def sparse_allreduce(hvd, g, name: str, average: bool):
    """IndexedSlices summed (or averaged) over the ranks: their values and indices gathered.

    What hvd.allreduce does for IndexedSlices, but with explicit names: its own
    are taken from the tensors' graph names, which contain per-process layer
    names.
    """
    import tensorflow as tf

    values = hvd.allgather(g.values, name=f"{name}_values", ignore_name_scope=True)
    indices = hvd.allgather(g.indices, name=f"{name}_indices", ignore_name_scope=True)
    if average:
        values = values / tf.cast(hvd.size(), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=g.dense_shape)


def _spec(base: type, op: str, compression: str, sparse_as_dense: bool,
          name: str | None) -> _GradientAllreduce:
    """Checks the options and returns the allreduce they describe."""
    if op not in OPS:
        raise ValueError(f"op must be one of {list(OPS)}. Received: op={op!r}.")
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {list(COMPRESSIONS)}. "
                         f"Received: compression={compression!r}.")
    if name is not None and (not isinstance(name, str) or not name or "/" in name):
        raise ValueError("name must be a non-empty string without '/' (it prefixes the "
                         f"all-reduce names, the same on every rank). Received: name={name!r}.")
    prefix = name if name is not None else f"Distributed{base.__name__}"
    return _GradientAllreduce(op, compression, bool(sparse_as_dense), prefix)


def DistributedOptimizer(optimizer, name: str | None = None, *, op: str = "average",
                         compression: str = "none", backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = True,
                         sparse_as_dense: bool = False):
    """Wraps a Keras 3 optimizer so that gradients are allreduced before they apply.

    Modeled on Horovod's own `DistributedOptimizer`, for Keras 3. The returned
    optimizer is a new instance of a subclass of `type(optimizer)`, built from
    `optimizer.get_config()` (so wrap before training, as with Horovod). Its
    `get_config()` is the plain optimizer's (a saved model loads anywhere),
    and `type(opt).from_config(config)` returns another working distributed
    optimizer with the same options.

    Args:
        optimizer: An unbuilt `keras.optimizers.Optimizer`.
        name: Prefix of the all-reduce names, the same on every rank;
            "Distributed" + the optimizer's class name when None (Horovod's
            default).
        op: "average" (data parallelism: the mean gradient of the global
            batch) or "sum".
        compression: "none", or "fp16" to halve the bytes sent (values are
            cast to float16 for the allreduce and back).
        backward_passes_per_step: Accumulate this many local gradients
            (Keras 3's `gradient_accumulation_steps`) and allreduce and apply
            them once; the optimizer updates every k-th call.
        average_aggregated_gradients: Apply the mean of the k accumulated
            passes (the default here, as Keras 3 accumulates); False applies
            their sum (Horovod's default).
        sparse_as_dense: Convert IndexedSlices (embedding gradients) to dense
            tensors before the allreduce; otherwise they are allgathered.

    Returns:
        The distributed optimizer.

    Raises:
        ValueError: for an unknown op or compression, a bad name or
            `backward_passes_per_step`, an optimizer that is already built or
            already distributed, or one whose own accumulation disagrees.
    """
    spec = _spec(type(optimizer), op, compression, sparse_as_dense, name)
    return allreduce_optimizer.wrap(optimizer, spec, backward_passes_per_step,
                                    average_aggregated_gradients)


def distributed_class(base: type, name: str | None = None, *, op: str = "average",
                      compression: str = "none", average_aggregated_gradients: bool = True,
                      sparse_as_dense: bool = False) -> type:
    """The class `DistributedOptimizer(base(...), ...)` returns, for `custom_objects`.

    `keras.models.load_model(path, custom_objects={"SGD": distributed_class(
    keras.optimizers.SGD)})` restores a saved SGD as a distributed one, with
    its saved state; `tfdist.horovod.load_model` does this for every Keras
    optimizer. Arguments as in `DistributedOptimizer` (the accumulation,
    `backward_passes_per_step`, is part of the saved config).
    """
    spec = _spec(base, op, compression, sparse_as_dense, name)
    return allreduce_optimizer.distributed_class(base, spec, average_aggregated_gradients)
