"""What the tensor-parallel layers do across their devices, each step named.

Megatron-LM names its collectives (`megatron/core/tensor_parallel/mappings.py`);
here the shards are devices of one process, so each collective is one op placed
on the layer's first device, and autodiff gives its backward:

- `all_gather`: the shards' output slices concatenated (backward: each shard
  takes its slice of the gradient back, no reduction);
- `all_reduce`: the shards' partial outputs summed (backward: the same
  gradient to every shard).

`on_device` runs a shard's forward and its backward on the shard's device.
Imports TensorFlow and Keras: import it only where they may start
(`tfdist.model_parallel.tensor_parallel` does so lazily).
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops


def all_gather(slices, device):
    """The shards' slices joined along the last axis, on `device`."""
    with tf.device(device):
        return ops.concatenate(slices, axis=-1)


def all_reduce(partials, device):
    """The sum of the shards' partial results, on `device` (a single one passes as it is)."""
    with tf.device(device):
        return tf.add_n(partials) if len(partials) > 1 else partials[0]


def on_device(device, fn, *xs):
    """fn(*xs) with its forward and its backward ops on `device`.

    A GradientTape builds each op's gradient under the device scope of the
    `gradient` call (a stage's first device, in the pipeline), not where the
    op ran; this custom gradient takes the shard's own tape's gradient under
    `device`, so each shard's backward runs beside its forward. `xs` are the
    floating inputs to differentiate; `fn` may read variables and close over
    other tensors (masks).
    """
    @tf.custom_gradient
    def run(*inputs):
        with tf.device(device), tf.GradientTape() as tape:
            tape.watch(inputs)
            # One copy per argument: self-attention passes one tensor as query, key
            # and value, and each must get only its own part of the gradient.
            copies = [tf.identity(x) for x in inputs]
            y = fn(*copies)

        def grad(dy, variables=None):
            variables = list(variables or [])
            with tf.device(device):
                g = tape.gradient(y, [*copies, *variables], output_gradients=dy)
            return g[:len(inputs)], g[len(inputs):]

        return y, grad

    return run(*xs)


def sharded_init(initializer, full_shape, axis, start, stop):
    """An initializer for one shard of a weight, drawn at the weight's full shape.

    Drawing the full weight keeps the unsplit layer's fan-in and fan-out (its
    scale) and its values: shard i holds exactly the unsplit weight's slice.
    """
    cache = {}

    def init(shape, dtype=None):
        if "full" not in cache:
            cache["full"] = keras.initializers.get(initializer)(full_shape, dtype=dtype)
        index = (slice(None),) * axis + (slice(start, stop),)
        return cache["full"][index]

    return init


def serialize_init(initializer):
    """A layer config's form of an initializer (a name, or a serialized object)."""
    return keras.initializers.serialize(keras.initializers.get(initializer))
