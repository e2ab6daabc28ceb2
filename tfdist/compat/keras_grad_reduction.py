"""Keras 3 clips (and loss-scale-checks) gradients before the cross-replica all-reduce.

Upstream: Keras 3.15.1, `keras/src/optimizers/base_optimizer.py`
`_backend_apply_gradients` runs `_clip_gradients` (clipnorm, global_clipnorm,
clipvalue) and, with gradient accumulation, adds to the accumulators, and only
then calls `_backend_update_step`, where the TensorFlow optimizer
(`keras/src/backend/tensorflow/optimizer.py`, `_all_reduce_sum_gradients`)
all-reduces across replicas. So under any tf.distribute strategy each replica
clips its *local* gradient: `global_clipnorm` under 2 replicas is not the
single-device math. Keras 2 disabled clipping under strategies for exactly
this reason (tensorflow/tensorflow#33929: "before gradients get aggregated
(usually wrong)"); Keras 3 does it silently. The same ordering makes
`LossScaleOptimizer` decide "finite or not" from the first local replica's
unreduced gradients (its comment assumes they were reduced), and makes the
accumulators of a mirrored variable differ per replica. Gradient accumulation
under MirroredStrategy fails outright: the accumulate-or-update `ops.cond` has
branches that `merge_call`, which MirroredStrategy forbids in replica context.

The fix moves the all-reduce to the start of `apply`: gradients are summed
across replicas in replica context first, then clipped, checked, accumulated
and applied, and the optimizer's own all-reduce is skipped. An optimizer
wrapped by a LossScaleOptimizer gets already-reduced gradients from it and
does not reduce again. With accumulation under a strategy that needs
merge_call (MirroredStrategy), the reduced gradients are applied once in
cross-replica context, where Keras's cond is legal. Without a strategy (one
replica) nothing changes.
"""

from __future__ import annotations

UPSTREAM = "tensorflow/tensorflow#33929 (Keras 3 behaviour measured on 3.15.1)"
_state = {"applied": False, "originals": {}, "compression": "none"}


class KerasOptimizerInternalsChanged(RuntimeError):
    """The optimizer internals this workaround patches moved."""


def _classes():
    from keras.src.backend.tensorflow.optimizer import TFOptimizer
    from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer

    return TFOptimizer, LossScaleOptimizer


def set_compression(name: str) -> None:
    """Gradients are cast to `name`'s type ("none", "fp16", "bf16") for the all-reduce here.

    Process-wide, like the patch itself; the mirrored and multi_worker
    adapters set it from `--grad-compression` (see `tfdist.compression`).
    """
    from tfdist import compression

    _state["compression"] = compression.check(name)


def _reduce_first(grads, optimizer=None, variables=None):
    """Sums gradients over replicas when called in a replica context with several.

    An optimizer that shards its state across workers may sum them onto their
    owners instead (`_tfdist_reduce_grads`, `tfdist.zero.optimizer`); with
    gradient compression on, everything is all-reduced as before.
    """
    import tensorflow as tf

    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return grads
    reduce = getattr(optimizer, "_tfdist_reduce_grads", None)
    if reduce is not None and _state["compression"] == "none":
        scattered = reduce(list(grads), list(variables if variables is not None
                                             else optimizer._trainable_variables))
        if scattered is not None:
            return scattered
    grads = list(grads)
    present = [i for i, g in enumerate(grads) if g is not None]
    from tfdist import compression

    wire, restore = compression.compress([grads[i] for i in present], _state["compression"])
    reduced = compression.decompress(ctx.all_reduce(tf.distribute.ReduceOp.SUM, wire), restore)
    for i, g in zip(present, reduced):
        grads[i] = g
    return grads


def _needs_cross_replica_apply(self) -> bool:
    import tensorflow as tf

    ctx = tf.distribute.get_replica_context()
    return bool(getattr(self, "gradient_accumulation_steps", None)) and ctx is not None and (
        ctx.num_replicas_in_sync > 1
        and not tf.__internal__.distribute.strategy_supports_no_merge_call())


def _wrap_apply(original):
    def apply(self, grads, trainable_variables=None):
        if not getattr(self, "_tfdist_gets_reduced_grads", False):
            inner = getattr(self, "inner_optimizer", None)
            if inner is not None:  # a LossScaleOptimizer reduces for its inner one
                inner._tfdist_gets_reduced_grads = True
            grads = _reduce_first(grads, inner if inner is not None else self,
                                  trainable_variables)
        if _needs_cross_replica_apply(self):
            # Keras wraps the accumulate-or-update choice in a cond whose
            # branches merge_call, which MirroredStrategy refuses in replica
            # context ("merge_call called while defining a new graph").
            # The gradients are reduced, so equal on every replica: apply
            # them once, in cross-replica context, where the cond is legal.
            import tensorflow as tf

            def cross(distribution, grads, variables):
                local = [None if g is None else distribution.experimental_local_results(g)[0]
                         for g in grads]
                # Keras's inner maybe_merge_call would look for a replica
                # context; here, in cross-replica context, calling the update
                # function directly is what merge_call would do.
                extended = distribution.extended
                extended._use_merge_call = lambda: False
                try:
                    return original(self, local, variables)
                finally:
                    del extended._use_merge_call

            return tf.distribute.get_replica_context().merge_call(
                cross, args=(list(grads), trainable_variables))
        return original(self, grads, trainable_variables)

    apply.__wrapped__ = original
    return apply


def _no_second_reduce(self, grads_and_vars):
    """Gradients reach the update step already reduced (see `apply`)."""
    return list(grads_and_vars)


def apply() -> bool:
    """Patches Keras's TensorFlow optimizers once.

    Raises:
        KerasOptimizerInternalsChanged: if the patched methods are missing.
    """
    if _state["applied"]:
        return True
    tf_opt, lso = _classes()
    missing = [f"{cls.__name__}.{name}" for cls, name in (
        (tf_opt, "apply"), (tf_opt, "_all_reduce_sum_gradients"), (lso, "apply"))
        if not hasattr(cls, name)]
    if missing:
        import keras

        raise KerasOptimizerInternalsChanged(
            f"tfdist cannot move the gradient all-reduce before clipping on keras "
            f"{keras.__version__}: missing {missing}. HINT: use a keras version tfdist's README "
            "lists as tested, or update tfdist/compat/keras_grad_reduction.py.")
    _state["originals"] = {"tf_apply": tf_opt.apply, "lso_apply": lso.apply,
                           "reduce": tf_opt._all_reduce_sum_gradients}
    tf_opt.apply = _wrap_apply(tf_opt.apply)
    lso.apply = _wrap_apply(lso.apply)
    tf_opt._all_reduce_sum_gradients = _no_second_reduce
    _state["applied"] = True
    return True


def revert() -> None:
    """Restores Keras's own methods (for the test that shows the upstream behaviour)."""
    if not _state["applied"]:
        return
    tf_opt, lso = _classes()
    tf_opt.apply = _state["originals"]["tf_apply"]
    lso.apply = _state["originals"]["lso_apply"]
    tf_opt._all_reduce_sum_gradients = _state["originals"]["reduce"]
    _state["applied"] = False
