"""Each stage's optimizer work on the stage's own device.

An op without a device runs on the caller, which for stages in other
processes (#29) is the chief; so every op that reads a stage's gradients or
slots must be placed on that stage's device, or they cross to the chief and
back each step and the chief holds the whole model's. Keras 3's TensorFlow
optimizer places none of them: the default strategy's `extended.update` sets
no device, and clipping, the one-replica all-reduce and a LossScaleOptimizer's
unscale and finite check are plain ops.

`place(optimizer)` wraps one optimizer's methods so that each of these ops
runs on the device of the gradient or variable it reads: the same ops in the
same order, so the math is unchanged to the bit.
"""

from __future__ import annotations


def place(optimizer) -> None:
    """Runs `optimizer`'s per-variable work where each variable and gradient lives.

    Wraps, once per optimizer: the inner optimizer's `update_step` (on the
    variable's device), its one-replica all-reduce (skipped: it routed every
    gradient through an unplaced IdentityN), its global-norm clipping (each
    square-sum and scaling on the gradient's device) and, for a
    LossScaleOptimizer, its finite check and unscale (on each gradient's
    device; only one boolean per gradient reaches the caller).

    Args:
        optimizer: A compiled model's Keras optimizer, maybe a LossScaleOptimizer.
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if not getattr(inner, "_tfdist_placed_updates", False):
        _place_updates(inner)
    if inner is not optimizer and not getattr(optimizer, "_tfdist_placed_updates", False):
        _place_loss_scaling(optimizer)


def _place_updates(inner) -> None:
    """update_step, the one-replica all-reduce and global-norm clipping, placed."""
    import keras
    import tensorflow as tf

    update = inner.update_step

    def placed(gradient, variable, learning_rate):
        # Keras hands over its variables' tf.Variables (`.value` would be a method).
        held = variable.value if isinstance(variable, keras.Variable) else variable
        # For update_order, when the pipeline asks (a dict): this variable's update ops.
        record = inner._tfdist_update_ops
        graph = None if record is None or tf.executing_eagerly() else (
            tf.compat.v1.get_default_graph())
        first = len(graph.get_operations()) if graph is not None else 0
        with tf.device(held.device):
            result = update(gradient, variable, learning_rate)
        if graph is not None:
            record[id(held)] = graph.get_operations()[first:]
        return result

    all_reduce = inner._all_reduce_sum_gradients

    def one_replica(grads_and_vars):
        # One replica has nothing to sum, but the default strategy's all_reduce
        # still passes every gradient through an IdentityN with no device, which
        # put each stage's gradients on the caller's device and back.
        if tf.distribute.get_strategy().num_replicas_in_sync == 1:
            return list(grads_and_vars)
        return all_reduce(grads_and_vars)

    clip = type(inner)._clip_gradients  # Keras's, with tfdist's sparse-duplicates fix

    def placed_clip(grads):
        # Keras's clip_by_global_norm (the same ops, in the same order), with each
        # gradient's square-sum and its scaling on the gradient's device.
        if (inner.clipnorm or not inner.global_clipnorm
                or any(isinstance(g, tf.IndexedSlices) for g in grads)):
            return clip(inner, grads)
        from keras import ops

        squared = []
        for g in grads:
            if g is not None:
                with tf.device(g.device):
                    squared.append(ops.sum(ops.square(g)))
        use_norm = ops.sqrt(ops.sum(ops.stack(squared)))
        clip_norm = inner.global_clipnorm
        scale_for_finite = clip_norm * ops.minimum(1.0 / use_norm, 1.0 / clip_norm)
        scale = scale_for_finite + (use_norm - use_norm)
        out = []
        for g in grads:
            with tf.device(None if g is None else g.device):
                out.append(None if g is None else g * scale)
        return out

    inner.update_step = placed
    inner._tfdist_update_ops = None  # a dict while the pipeline records (update_order)
    inner._all_reduce_sum_gradients = one_replica
    inner._clip_gradients = placed_clip
    inner._tfdist_placed_updates = True


def _place_loss_scaling(lso) -> None:
    """A LossScaleOptimizer's finite check and unscale on each gradient's device.

    Keras 3.15.1's `check_finite` and `_stateful_handle_finite_grads`
    (keras/src/optimizers/loss_scale_optimizer.py), the same ops in the same
    order, with each gradient's `all(isfinite(g))` and `g / scale` under the
    gradient's device. Only the per-gradient booleans are stacked and reduced
    on the caller; the scale (a scalar) travels to each stage.
    """
    import tensorflow as tf
    from keras import ops

    def check_finite(grads):
        finite_grads = []
        for g in (g for g in grads if g is not None):
            with tf.device(g.device):
                finite_grads.append(ops.all(ops.isfinite(g)))
        return ops.all(ops.convert_to_tensor(finite_grads))

    def handle_finite_grads(grads, trainable_variables):
        scale = lso.dynamic_scale
        tvs = trainable_variables or lso._trainable_variables
        unscaled_grads = []
        for g, v in zip(grads, tvs):
            if g is None or lso._overwrite_variable_with_gradient(v):
                unscaled_grads.append(g)
            else:
                with tf.device(g.device):
                    unscaled_grads.append(ops.divide(g, scale))
        lso.inner_optimizer.apply(unscaled_grads, trainable_variables=trainable_variables)

        def upscale():
            lso.step_counter.assign(0)
            lso.dynamic_scale.assign(ops.multiply(lso.dynamic_scale, 2.0))

        def increment():
            lso.step_counter.assign_add(1)

        ops.cond(ops.equal(lso.step_counter, lso.dynamic_growth_steps - 1), upscale, increment)

    lso.check_finite = check_finite
    lso._stateful_handle_finite_grads = handle_finite_grads
    lso._tfdist_placed_updates = True
