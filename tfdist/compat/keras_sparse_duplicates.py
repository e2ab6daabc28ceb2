"""Keras 3 optimizers apply sparse gradients with repeated rows as if they were separate.

Upstream: Keras 3.15.1. Since keras-team/keras#18692 ("All optimizers handle
sparse gradients in the form of `tf.IndexedSlices`") an optimizer's update
step runs its Keras ops on the `tf.IndexedSlices` an `Embedding` (or any
gather) produces, and `keras/src/backend/tensorflow/sparse.py` applies an
elementwise op such as `ops.square` to each slice separately. A batch that
looks up the same row twice gives an IndexedSlices with that index twice, so
Adam's second moment gets `g1**2 + g2**2` where the gradient of that row is
`g1 + g2` and the dense math (and Keras 2's optimizers, which summed repeated
indices first with `_deduplicate_indexed_slices`) has `(g1 + g2)**2`. Clipping
by global norm measures the slices the same way. SGD's update is linear, so
only stateful optimizers differ (measured: after one step on a row looked up
twice, Adam 3.4e-4, RMSprop 1.1e-3, Adagrad 3.4e-4 from the dense result; SGD
6e-8).

Why it matters to tfdist: the result then depends on how lookups are spread
over replicas and engines. MultiWorkerMirrored and Horovod all-gather
IndexedSlices (repeats kept, across replicas too), the shared-memory engine
sums them densely (repeats merged): 2 shm ranks ended far from one replica
under Adam (max relative difference 1.8 after 12 steps) while SGD agreed.

The fix sums repeated indices first, in `_clip_gradients`, which Keras calls
once per update step after accumulation and before clipping and the update,
and which every tfdist engine reaches after its all-reduce. Every strategy
then applies the dense math, the same on one replica and on N.
"""

from __future__ import annotations

UPSTREAM = "keras-team/keras#18692 (sparse updates without summing repeated indices; 3.15.1)"
_state = {"applied": False, "original": None}


class KerasOptimizerInternalsChanged(RuntimeError):
    """The optimizer method this workaround patches moved."""


def _base():
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    return BaseOptimizer


def deduplicate(grad):
    """`grad` with the values of repeated indices summed (IndexedSlices); others unchanged.

    Args:
        grad: A gradient: a tensor, a `tf.IndexedSlices` or None.

    Returns:
        For an IndexedSlices, one with unique indices (in order of first
        appearance) whose values are the sums; anything else as it came.
    """
    import tensorflow as tf

    if not isinstance(grad, tf.IndexedSlices):
        return grad
    unique, positions = tf.unique(grad.indices)
    values = tf.math.unsorted_segment_sum(grad.values, positions, tf.shape(unique)[0])
    return tf.IndexedSlices(values, unique, dense_shape=grad.dense_shape)


def is_applied() -> bool:
    """Whether the patch is on (an optimizer that overrides `_clip_gradients` then
    deduplicates itself: `tfdist.zero.optimizer`)."""
    return _state["applied"]


def _wrap(original):
    def _clip_gradients(self, grads):
        return original(self, [deduplicate(g) for g in grads])

    _clip_gradients.__wrapped__ = original
    return _clip_gradients


def apply() -> bool:
    """Patches Keras's base optimizer once.

    Raises:
        KerasOptimizerInternalsChanged: when `_clip_gradients` is gone.
    """
    if _state["applied"]:
        return True
    base = _base()
    if not hasattr(base, "_clip_gradients"):
        import keras

        raise KerasOptimizerInternalsChanged(
            f"keras {keras.__version__}: BaseOptimizer has no _clip_gradients, where tfdist "
            "sums repeated sparse-gradient indices. HINT: use a keras version tfdist's README "
            "lists as tested, or update tfdist/compat/keras_sparse_duplicates.py.")
    _state["original"] = base._clip_gradients
    base._clip_gradients = _wrap(base._clip_gradients)
    _state["applied"] = True
    return True


def revert() -> None:
    """Restores Keras's own method (for the test that shows the upstream behaviour)."""
    if _state["applied"]:
        _base()._clip_gradients = _state["original"]
        _state["applied"] = False
