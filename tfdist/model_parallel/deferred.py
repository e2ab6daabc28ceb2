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

    Raises:
        ConfigError: for a tensor-parallel layer (its shards would need the whole
            weight first) or layers whose weights do not match.
    """
    import tensorflow as tf

    from tfdist.model_parallel.tensor_parallel import is_tensor_parallel

    for layer in clone.layers:
        if not layer.weights:
            continue
        src = source.get_layer(layer.name)
        if is_tensor_parallel(layer) or len(src.weights) != len(layer.weights):
            raise ConfigError(f"layer {layer.name!r}: its placed copy cannot take the initial "
                              "values of a model built without values (tensor-parallel or "
                              "different weights).")
        for s, c in zip(src.weights, layer.weights):
            if not is_deferred(c):
                raise ConfigError(f"{c.path}: already has a value; build the copy with "
                                  "build_without_values.")
            c._initializer = (s._initializer if is_deferred(s)
                              else lambda shape, dtype, v=s.numpy(): v)
            with tf.device(getattr(layer, "_tfdist_device", None)):
                c._deferred_initialize()  # the value is made here, once, on the device
