"""A model built without its weights' values, so that no process holds the whole model.

The chief of a pipeline across processes builds the recipe's model only to
learn its graph and its layers; each stage's placed copy then gets its initial
values computed on its own task. Keras 3 defers a variable's value inside a
`StatelessScope` (keeping its initializer, as its JAX distribution does for
models larger than one device). Keras's random initializers hold an integer
seed drawn when they were made, so computing the initializer later, on
another device, gives the values an eager build would have had: the split
run starts exactly where the one-process run does.

Uses Keras internals (`Variable._initializer`, the "uninitialized_variables"
global list), tested in tests/model_parallel/test_deferred.py against Keras's
eager build.
"""

from __future__ import annotations

from tfdist.errors import ConfigError


def build_without_values(build):
    """`build()` with every variable's value deferred; the model, not registered for
    Keras's own deferred initialization (which would put every value on this process)."""
    import keras
    from keras.src.backend.common import global_state

    with keras.StatelessScope(initialize_variables=False):
        model = build()
    mine = {id(v) for v in model.variables}
    pending = global_state.get_global_attribute("uninitialized_variables", [])
    global_state.set_global_attribute("uninitialized_variables",
                                      [v for v in pending if id(v) not in mine])
    return model


def is_deferred(variable) -> bool:
    """True for a variable made by `build_without_values` (no value, an initializer)."""
    return (getattr(variable, "_value", True) is None
            and getattr(variable, "_initializer", None) is not None)


def has_deferred(model) -> bool:
    """True when any of `model`'s variables has no value yet."""
    return any(is_deferred(v) for v in model.variables)


def initialize_like(source, clone) -> None:
    """Gives each weight of `clone` (built by `build_without_values` too, its layers
    placed) the initial value of `source`'s, computed and kept on the layer's device.

    A tensor-parallel layer's shards each compute the whole weight's initial
    value on their own device and keep their slice: the values one process
    would have split, and no process but the shard's holds them.

    Raises:
        ConfigError: for layers whose weights do not match.
    """
    from tfdist.model_parallel.tensor_parallel import is_tensor_parallel

    for layer in clone.layers:
        if not layer.weights:
            continue
        src = source.get_layer(layer.name)
        if is_tensor_parallel(layer):
            _initialize_shards(src, layer)
            continue
        if len(src.weights) != len(layer.weights):
            raise ConfigError(f"layer {layer.name!r}: its placed copy cannot take the initial "
                              "values of a model built without values (different weights).")
        device = getattr(layer, "_tfdist_device", None)
        for s, c in zip(src.weights, layer.weights):
            _initialize(c, _initializer_of(s), device)


def _initialize_shards(src, layer) -> None:
    """Each shard of tensor-parallel `layer` from the plain `src` layer's weight."""
    groups, devices = layer._plain_groups(), layer.shard_devices()
    if len(src.weights) != len(groups):
        raise ConfigError(f"layer {layer.name!r}: its tensor-parallel copy holds {len(groups)} "
                          f"weights, the plain layer {len(src.weights)}.")
    for s, (shards, axis), places in zip(src.weights, groups, devices):
        start = 0
        for c, device in zip(shards, places):
            stop = start + (c.shape[axis] if axis is not None else 0)
            index = (slice(None),) * axis + (slice(start, stop),) if axis is not None else ()
            _initialize(c, _sliced(_initializer_of(s), tuple(s.shape), index), device)
            start = stop


def _initializer_of(variable):
    """What computes `variable`'s initial value (its own value when it has one)."""
    if is_deferred(variable):
        return variable._initializer
    return lambda shape, dtype=None, v=variable.numpy(): v


def _sliced(initializer, shape, index):
    """An initializer for `index` of the weight `initializer` makes at `shape`."""
    def init(_, dtype=None):
        full = initializer(shape, dtype=dtype)
        return full[index] if index else full
    return init


def _initialize(variable, initializer, device) -> None:
    """Computes a deferred variable's value with `initializer`, on `device`, once."""
    import tensorflow as tf

    if not is_deferred(variable):
        raise ConfigError(f"{variable.path}: already has a value; build the copy with "
                          "build_without_values.")
    variable._initializer = initializer
    with tf.device(device):
        variable._deferred_initialize()  # the value is made here, once, on the device
