"""tensorflow#53671: placing a layer's construction does not place its computation.

Building a Keras layer under `tf.device(D)` puts its variables on D, but the
ops of every later call go wherever the caller's device scope says (usually
the default device), and only the variable reads follow the variables. A
model "split" that way keeps all of its compute on one device and copies
weights to it each step. `place_layer` wraps a layer's `build` and `call` so
both run under `tf.device(D)`; tests/compat/test_tf_device_scope.py shows
the upstream behaviour and the fix on a traced graph.
"""

from __future__ import annotations

import functools

UPSTREAM = "tensorflow/tensorflow#53671"


def place_layer(layer, device: str):
    """Makes `layer` create its variables and run its forward ops on `device`.

    Call it before the layer is built (a layer without weights may be built
    already: only its call is placed then). The wrappers are instance attributes,
    so the layer's class and config (and a saved model.keras) stay plain Keras.

    Args:
        layer: An unbuilt Keras layer.
        device: A TensorFlow device name, e.g. "/cpu:1" or "/gpu:0".

    Returns:
        The same layer, for chaining.

    Raises:
        ValueError: when the layer is already built and has weights (they
            exist elsewhere).
    """
    import tensorflow as tf

    if layer.built and layer.weights:
        raise ValueError(f"place_layer needs an unbuilt layer, so that its variables are created "
                         f"on {device}. Received built layer {layer.name!r}.")
    build, call = layer.build, layer.call

    @functools.wraps(build)
    def placed_build(*args, **kwargs):
        with tf.device(device):
            return build(*args, **kwargs)

    @functools.wraps(call)
    def placed_call(*args, **kwargs):
        with tf.device(device):
            return call(*args, **kwargs)

    layer.build = placed_build
    layer.call = placed_call
    layer._tfdist_device = device  # read by the placement table
    return layer
