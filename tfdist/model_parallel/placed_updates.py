"""Each stage's optimizer work on the stage's own device.

An op without a device runs on the caller, which for stages in other
processes (#29) is the chief; so every op that reads a stage's gradients or
slots must be placed on that stage's device, or they cross to the chief and
back each step and the chief holds the whole model's. Keras 3's TensorFlow
optimizer places none of them: the default strategy's `extended.update` sets
no device, and clipping, the one-replica all-reduce and a LossScaleOptimizer's
unscale and finite check are plain ops.

`place(optimizer)` puts `Placed` on the optimizer's path (`tfdist.gradient_path`),
and `PlacedScale` on a LossScaleOptimizer's around it, which run each of these ops on
the device of the gradient or variable it reads: the same ops in the same order,
so the math is unchanged to the bit. `recording()` collects each variable's
update ops while a pipeline traces its step (`update_order`).
"""

from __future__ import annotations

import contextlib
import dataclasses

from tfdist import gradient_path

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

    Puts `Placed` in front of the inner optimizer's path (a class of tfdist's gradient
    path: `update_step` on the variable's device, the one-replica all-reduce skipped,
    global-norm clipping placed) and `PlacedScale` in front of a LossScaleOptimizer's
    (its finite check and unscale on each gradient's device; only one boolean per
    gradient reaches the caller). Once per optimizer: the object keeps its state and
    takes the new class (`__class__`; Keras compiled it before the pipeline sees it).

    Args:
        optimizer: A compiled model's Keras optimizer, maybe a LossScaleOptimizer.
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if not gradient_path.steps_of(inner, Placed):
        inner.__class__ = gradient_path.extended(type(inner), Placed())
    if inner is not optimizer and not gradient_path.steps_of(optimizer, PlacedScale):
        optimizer.__class__ = gradient_path.extended(type(optimizer), PlacedScale())


@dataclasses.dataclass(frozen=True)
class Placed(gradient_path.Step):
    """The path's steps with each op on the device of the gradient or variable it reads
    (steps of `tfdist.gradient_path`: the same ops in the same order)."""

    def update_one(self, opt, gradient, variable, learning_rate, then):
        import keras
        import tensorflow as tf

        # Keras hands over its variables' tf.Variables (`.value` would be a method).
        held = variable.value if isinstance(variable, keras.Variable) else variable
        record = _RECORDING[-1] if _RECORDING else None  # update_order's, while it asks
        graph = None if record is None or tf.executing_eagerly() else (
            tf.compat.v1.get_default_graph())
        first = len(graph.get_operations()) if graph is not None else 0
        with tf.device(held.device):
            result = then(gradient, variable, learning_rate)
        if graph is not None:
            record[id(held)] = graph.get_operations()[first:]
        return result

    def sum_replicas(self, opt, grads_and_vars, then):
        import tensorflow as tf

        # One replica has nothing to sum, but the default strategy's all_reduce
        # still passes every gradient through an IdentityN with no device, which
        # put each stage's gradients on the caller's device and back.
        if tf.distribute.get_strategy().num_replicas_in_sync == 1:
            return list(grads_and_vars)
        return then(grads_and_vars)

    def clip(self, opt, grads, then):
        # Keras's clip_by_global_norm (the same ops, in the same order; Keras's own, with
        # tfdist's sparse-duplicates fix, otherwise), with each gradient's square-sum
        # and its scaling on the gradient's device.
        import tensorflow as tf

        if (opt.clipnorm or not opt.global_clipnorm
                or any(isinstance(g, tf.IndexedSlices) for g in grads)):
            return then(grads)
        return gradient_path.clip_by_global_norm(grads, opt.global_clipnorm, placed=True)


@dataclasses.dataclass(frozen=True)
class PlacedScale(gradient_path.Step):
    """A LossScaleOptimizer's finite check and unscale on each gradient's device.

    Keras 3.15.1's `check_finite` and `_stateful_handle_finite_grads`
    (keras/src/optimizers/loss_scale_optimizer.py), the same ops in the same
    order, with each gradient's `all(isfinite(g))` and `g / scale` under the
    gradient's device. Only the per-gradient booleans are stacked and reduced
    on the caller; the scale (a scalar) travels to each stage.
    """

    def finite(self, opt, grads, then):
        import tensorflow as tf
        from keras import ops

        finite_grads = []
        for g in (g for g in grads if g is not None):
            with tf.device(g.device):
                finite_grads.append(ops.all(ops.isfinite(g)))
        return ops.all(ops.convert_to_tensor(finite_grads))

    def unscale(self, opt, grads, trainable_variables, then):
        import tensorflow as tf
        from keras import ops

        scale = opt.dynamic_scale
        tvs = trainable_variables or opt._trainable_variables
        unscaled_grads = []
        for g, v in zip(grads, tvs):
            if g is None or opt._overwrite_variable_with_gradient(v):
                unscaled_grads.append(g)
            else:
                with tf.device(g.device):
                    unscaled_grads.append(ops.divide(g, scale))
        opt.inner_optimizer.apply(unscaled_grads, trainable_variables=trainable_variables)

        def upscale():
            opt.step_counter.assign(0)
            opt.dynamic_scale.assign(ops.multiply(opt.dynamic_scale, 2.0))

        def increment():
            opt.step_counter.assign_add(1)

        ops.cond(ops.equal(opt.step_counter, opt.dynamic_growth_steps - 1), upscale,
                 increment)
