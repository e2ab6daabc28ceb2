"""Loading a saved model with its optimizer restored as a DistributedOptimizer.

`model.save` of a model compiled with `DistributedOptimizer` records the
optimizer under its plain class name, so the file loads anywhere (as the
plain optimizer). To go on training it under Horovod, as with Horovod's own
`hvd.load_model`, `load_model` loads it and replaces the optimizer with a
distributed one of the same class and config that carries the loaded state
(iterations, momentum, accumulators). That also works for a model saved
with a plain optimizer, whose Keras built-in class `custom_objects` cannot
redirect.
"""

from __future__ import annotations


def _distributed_copy(optimizer, model, options: dict):
    """A DistributedOptimizer equal to the built `optimizer`, state included."""
    import keras

    from tfdist.horovod.optimizer import distributed_class

    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise ValueError(
            "tfdist.horovod.load_model does not restore a LossScaleOptimizer (mixed_float16) "
            "as distributed. Received: a model saved with LossScaleOptimizer. HINT: load it "
            "with keras.models.load_model, and recompile it with "
            "DistributedOptimizer(<inner optimizer>) under the mixed_float16 policy.")
    copy = distributed_class(type(optimizer), **options).from_config(optimizer.get_config())
    copy.build(model.trainable_variables)
    if [v.shape for v in copy.variables] != [v.shape for v in optimizer.variables]:
        raise ValueError(f"Cannot carry the loaded {type(optimizer).__name__}'s state over: "
                         f"{len(optimizer.variables)} variables loaded, "
                         f"{len(copy.variables)} built.")
    for dst, src in zip(copy.variables, optimizer.variables):
        dst.assign(src)
    return copy


def load_model(filepath, custom_optimizers=None, custom_objects=None, **options):
    """`keras.models.load_model` with the optimizer restored as a DistributedOptimizer.

    Like Horovod's `hvd.load_model`. Typically rank 0 loads (resuming), the
    other ranks build a fresh model and optimizer, and `BroadcastInitialState`
    (or `broadcast_state`) then gives every rank rank 0's weights and
    optimizer state. For plain Keras loading, a model saved with a
    DistributedOptimizer also loads with `keras.models.load_model(path,
    custom_objects={"SGD": tfdist.horovod.distributed_class(keras.optimizers.SGD)})`.

    Args:
        filepath: A `.keras` file saved by `model.save`.
        custom_optimizers: Optimizer classes of your own that the file may
            name (Keras's own are always found).
        custom_objects: Passed to `keras.models.load_model`.
        **options: `DistributedOptimizer`'s options (`op`, `compression`,
            `sparse_as_dense`, `average_aggregated_gradients`, `name`).

    Returns:
        The loaded model; when it was saved compiled, its optimizer is
        distributed, with the saved state.

    Raises:
        ValueError: for a model saved with a LossScaleOptimizer.
    """
    import keras

    objects = {cls.__name__: cls for cls in custom_optimizers or []}
    objects.update(custom_objects or {})
    model = keras.models.load_model(filepath, custom_objects=objects)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not getattr(optimizer, "_tfdist_distributed", False):
        model.optimizer = _distributed_copy(optimizer, model, options)
    return model
