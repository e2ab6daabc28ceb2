"""Each stage's optimizer work on the stage's own device.

An op without a device runs on the caller, which for stages in other
processes (#29) is the chief; so every op that reads a stage's gradients or
slots must be placed on that stage's device, or they cross to the chief and
back each step and the chief holds the whole model's. Keras 3's TensorFlow
optimizer places none of them: the default strategy's `extended.update` sets
no device, and clipping, the one-replica all-reduce and a LossScaleOptimizer's
unscale and finite check are plain ops.

`place(optimizer)` gives the optimizer (and a LossScaleOptimizer around it)
a subclass of its own class whose overrides run each of these ops on the
device of the gradient or variable it reads: the same ops in the same order,
so the math is unchanged to the bit. `recording()` collects each variable's
update ops while a pipeline traces its step (`update_order`).
"""

from __future__ import annotations

import contextlib
import functools

# While a pipeline traces its step: {id(tf.Variable): its update ops}, filled by the
# placed `update_step` (`recording`); empty otherwise.
_RECORDING: list[dict] = []


@contextlib.contextmanager
def recording(enabled: bool = True):
    """Collects each variable's update ops traced inside, for `update_order`.

    Yields:
        {id(tf.Variable): [ops]} (None when not `enabled`); dropped on leaving, so
        no trace's ops are kept alive past it.
    """
    if not enabled:
        yield None
        return
    ops: dict = {}
    _RECORDING.append(ops)
    try:
        yield ops
    finally:
        _RECORDING.remove(ops)


def place(optimizer) -> None:
    """Runs `optimizer`'s per-variable work where each variable and gradient lives.

    Gives the inner optimizer a subclass of its class (`_placed_class`) whose
    `update_step` runs on the variable's device, whose one-replica all-reduce is
    skipped (it routed every gradient through an unplaced IdentityN) and whose
    global-norm clipping puts each square-sum and scaling on the gradient's
    device; and a LossScaleOptimizer one (`_placed_loss_scale_class`) whose finite
    check and unscale run on each gradient's device (only one boolean per
    gradient reaches the caller). Once per optimizer.

    Args:
        optimizer: A compiled model's Keras optimizer, maybe a LossScaleOptimizer.
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if not getattr(inner, "_tfdist_placed_updates", False):
        inner.__class__ = _placed_class(type(inner))
    if inner is not optimizer and not getattr(optimizer, "_tfdist_placed_updates", False):
        optimizer.__class__ = _placed_loss_scale_class(type(optimizer))


@functools.cache
def _placed_class(base: type) -> type:
    """`base` with update_step, the one-replica all-reduce and global-norm clipping placed."""

    def update_step(self, gradient, variable, learning_rate):
        import keras
        import tensorflow as tf

        # Keras hands over its variables' tf.Variables (`.value` would be a method).
        held = variable.value if isinstance(variable, keras.Variable) else variable
        record = _RECORDING[-1] if _RECORDING else None  # update_order's, while it asks
        graph = None if record is None or tf.executing_eagerly() else (
            tf.compat.v1.get_default_graph())
        first = len(graph.get_operations()) if graph is not None else 0
        with tf.device(held.device):
            result = base.update_step(self, gradient, variable, learning_rate)
        if graph is not None:
            record[id(held)] = graph.get_operations()[first:]
        return result

    def _all_reduce_sum_gradients(self, grads_and_vars):
        import tensorflow as tf

        # One replica has nothing to sum, but the default strategy's all_reduce
        # still passes every gradient through an IdentityN with no device, which
        # put each stage's gradients on the caller's device and back.
        if tf.distribute.get_strategy().num_replicas_in_sync == 1:
            return list(grads_and_vars)
        return base._all_reduce_sum_gradients(self, grads_and_vars)

    def _clip_gradients(self, grads):
        # Keras's clip_by_global_norm (the same ops, in the same order; Keras's own, with
        # tfdist's sparse-duplicates fix, otherwise), with each gradient's square-sum
        # and its scaling on the gradient's device.
        import tensorflow as tf

        if (self.clipnorm or not self.global_clipnorm
                or any(isinstance(g, tf.IndexedSlices) for g in grads)):
            return base._clip_gradients(self, grads)
        return _placed_clip(grads, self.global_clipnorm)

    return type(base.__name__, (base,), {
        "update_step": update_step,
        "_all_reduce_sum_gradients": _all_reduce_sum_gradients,
        "_clip_gradients": _clip_gradients,
        "_tfdist_placed_updates": True,
        "__module__": base.__module__,
        "__doc__": f"{base.__name__} whose per-variable work runs on each variable's device.",
    })


def _placed_clip(grads, clip_norm):
    """Keras's clip_by_global_norm, each gradient's ops on its device."""
    import tensorflow as tf
    from keras import ops

    squared = []
    for g in grads:
        if g is not None:
            with tf.device(g.device):
                squared.append(ops.sum(ops.square(g)))
    use_norm = ops.sqrt(ops.sum(ops.stack(squared)))
    scale_for_finite = clip_norm * ops.minimum(1.0 / use_norm, 1.0 / clip_norm)
    scale = scale_for_finite + (use_norm - use_norm)
    out = []
    for g in grads:
        with tf.device(None if g is None else g.device):
            out.append(None if g is None else g * scale)
    return out


@functools.cache
def _placed_loss_scale_class(base: type) -> type:
    """A LossScaleOptimizer class whose finite check and unscale run on each gradient's
    device.

    Keras 3.15.1's `check_finite` and `_stateful_handle_finite_grads`
    (keras/src/optimizers/loss_scale_optimizer.py), the same ops in the same
    order, with each gradient's `all(isfinite(g))` and `g / scale` under the
    gradient's device. Only the per-gradient booleans are stacked and reduced
    on the caller; the scale (a scalar) travels to each stage.
    """

    def check_finite(self, grads):
        import tensorflow as tf
        from keras import ops

        finite_grads = []
        for g in (g for g in grads if g is not None):
            with tf.device(g.device):
                finite_grads.append(ops.all(ops.isfinite(g)))
        return ops.all(ops.convert_to_tensor(finite_grads))

    def _stateful_handle_finite_grads(self, grads, trainable_variables):
        import tensorflow as tf
        from keras import ops

        scale = self.dynamic_scale
        tvs = trainable_variables or self._trainable_variables
        unscaled_grads = []
        for g, v in zip(grads, tvs):
            if g is None or self._overwrite_variable_with_gradient(v):
                unscaled_grads.append(g)
            else:
                with tf.device(g.device):
                    unscaled_grads.append(ops.divide(g, scale))
        self.inner_optimizer.apply(unscaled_grads, trainable_variables=trainable_variables)

        def upscale():
            self.step_counter.assign(0)
            self.dynamic_scale.assign(ops.multiply(self.dynamic_scale, 2.0))

        def increment():
            self.step_counter.assign_add(1)

        ops.cond(ops.equal(self.step_counter, self.dynamic_growth_steps - 1), upscale,
                 increment)

    return type(base.__name__, (base,), {
        "check_finite": check_finite,
        "_stateful_handle_finite_grads": _stateful_handle_finite_grads,
        "_tfdist_placed_updates": True,
        "__module__": base.__module__,
        "__doc__": f"{base.__name__} whose finite check and unscale run on each "
                   "gradient's device.",
    })
