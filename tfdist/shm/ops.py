"""TensorFlow side of the shared-memory engine: an allreduce op and the optimizer."""

from __future__ import annotations

from tfdist import allreduce_optimizer
from tfdist.shm import runtime


def allreduce(tensors, average: bool = True):
    """Allreduces a list of dense tensors in one op (eager or inside tf.function).

    All tensors go through one `tf.numpy_function`, so every rank reduces them
    in the same order whatever order TensorFlow schedules ops in, and the
    inputs are read in place (no concatenation).

    Args:
        tensors: Dense tensors, the same shapes and dtypes on every rank.
        average: Mean instead of sum.

    Returns:
        The reduced tensors, with the inputs' shapes.
    """
    import tensorflow as tf

    comm = runtime.communicator()
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    if comm.size == 1:
        return tensors

    def reduce(*arrays):
        return comm.allreduce(arrays, average=average)

    outs = tf.numpy_function(reduce, tensors, [t.dtype for t in tensors], stateful=True,
                             name="tfdist_shm_allreduce")
    for out, t in zip(outs, tensors):
        out.set_shape(t.shape)
    return list(outs)


class _GradientAllreduce:
    """Averages a list of gradients (None kept, IndexedSlices made dense)."""

    def __call__(self, grads):
        import tensorflow as tf

        index = [i for i, g in enumerate(grads) if g is not None]
        dense = [tf.convert_to_tensor(grads[i]) for i in index]
        out = list(grads)
        for i, g in zip(index, allreduce(dense, average=True)):
            out[i] = g
        return out


def DistributedOptimizer(optimizer, *, backward_passes_per_step: int = 1):
    """Wraps a Keras 3 optimizer so gradients are averaged across the shm ranks first.

    Compile the model with `jit_compile=False`: the allreduce is a
    `tf.numpy_function`, which XLA cannot compile.

    Args:
        optimizer: An unbuilt `keras.optimizers.Optimizer`.
        backward_passes_per_step: Accumulate this many local gradients and
            allreduce and apply their mean once.

    Returns:
        The distributed optimizer (see `tfdist.allreduce_optimizer.wrap`).
    """
    return allreduce_optimizer.wrap(optimizer, _GradientAllreduce(), backward_passes_per_step)
