"""Tensor parallelism: one Dense/MLP block split across devices (Megatron-LM style).

`ColumnParallelDense` splits a kernel by output columns: device i holds
kernel[:, cols_i] and computes its slice of the activations, with no
communication. `RowParallelDense` takes those slices and splits its kernel by
input rows: device i computes x_i @ kernel[rows_i, :], and the partial sums
are added (the all-reduce; here a sum on the first device). `ParallelMLP`
chains the two, so an MLP block needs one reduction forward and one backward,
and each device holds 1/N of its parameters.

Build them in a process whose devices exist (logical CPUs: configure_runtime).
"""

from __future__ import annotations

import functools

from tfdist.model_parallel import plan


def _bounds(total: int, parts: int) -> list[tuple[int, int]]:
    sizes, out, start = plan.even_split(total, parts), [], 0
    for size in sizes:
        out.append((start, start + size))
        start += size
    return out


@functools.lru_cache(maxsize=None)
def _classes():
    import keras
    import tensorflow as tf

    def sharded_init(initializer, full_shape, axis, start, stop):
        """An initializer for one shard of a kernel drawn at its full shape.

        Drawing the full kernel keeps fan-in/fan-out (and so the scale) of an
        unsplit Dense.
        """
        cache = {}

        def init(shape, dtype=None):
            if "full" not in cache:
                cache["full"] = keras.initializers.get(initializer)(full_shape, dtype=dtype)
            full = cache["full"]
            return full[:, start:stop] if axis == 1 else full[start:stop, :]

        return init

    @keras.saving.register_keras_serializable(package="tfdist")
    class ColumnParallelDense(keras.layers.Layer):
        """Dense whose output columns are split over `devices`; returns the list of slices.

        Args:
            units: Output size of the whole (unsplit) layer.
            devices: Device names, one shard each.
            activation: Applied to each slice (elementwise, so split-safe).
            use_bias: Whether each shard has its slice of the bias.
            kernel_initializer: Drawn at the full (in, units) shape, then sliced.
        """

        def __init__(self, units, devices, activation=None, use_bias=True,
                     kernel_initializer="glorot_uniform", **kwargs):
            super().__init__(**kwargs)
            self.units, self.devices = int(units), list(devices)
            self.activation = keras.activations.get(activation)
            self.use_bias, self.kernel_initializer = use_bias, kernel_initializer
            self.bounds = _bounds(self.units, len(self.devices))

        def build(self, input_shape):
            fan_in = int(input_shape[-1])
            self.kernels, self.biases = [], []
            for i, (device, (a, b)) in enumerate(zip(self.devices, self.bounds)):
                with tf.device(device):
                    self.kernels.append(self.add_weight(
                        shape=(fan_in, b - a), name=f"kernel_{i}",
                        initializer=sharded_init(self.kernel_initializer, (fan_in, self.units),
                                                 1, a, b)))
                    if self.use_bias:
                        self.biases.append(self.add_weight(shape=(b - a,), name=f"bias_{i}",
                                                           initializer="zeros"))

        def call(self, x):
            outs = []
            for i, device in enumerate(self.devices):
                with tf.device(device):
                    y = tf.matmul(x, self.kernels[i])
                    if self.use_bias:
                        y = y + self.biases[i]
                    outs.append(self.activation(y))
            return outs

        def get_config(self):
            return {**super().get_config(), "units": self.units, "devices": self.devices,
                    "activation": keras.activations.serialize(self.activation),
                    "use_bias": self.use_bias,
                    "kernel_initializer": keras.initializers.serialize(
                        keras.initializers.get(self.kernel_initializer))}

    @keras.saving.register_keras_serializable(package="tfdist")
    class RowParallelDense(keras.layers.Layer):
        """Dense whose input rows are split over `devices`; takes the column slices.

        Args:
            units: Output size.
            devices: Device names; input slice i is multiplied on device i.
            use_bias: One bias, added once after the sum (on the first device).
            kernel_initializer: Drawn at the full (in, units) shape, then sliced.
        """

        def __init__(self, units, devices, use_bias=True, kernel_initializer="glorot_uniform",
                     **kwargs):
            super().__init__(**kwargs)
            self.units, self.devices = int(units), list(devices)
            self.use_bias, self.kernel_initializer = use_bias, kernel_initializer

        def build(self, input_shapes):
            widths = [int(s[-1]) for s in input_shapes]
            if len(widths) != len(self.devices):
                raise ValueError(f"RowParallelDense over {len(self.devices)} devices needs "
                                 f"{len(self.devices)} input slices. Received {len(widths)}.")
            fan_in, start, self.kernels = sum(widths), 0, []
            for i, (device, w) in enumerate(zip(self.devices, widths)):
                with tf.device(device):
                    self.kernels.append(self.add_weight(
                        shape=(w, self.units), name=f"kernel_{i}",
                        initializer=sharded_init(self.kernel_initializer, (fan_in, self.units),
                                                 0, start, start + w)))
                start += w
            if self.use_bias:
                with tf.device(self.devices[0]):
                    self.bias = self.add_weight(shape=(self.units,), name="bias",
                                                initializer="zeros")

        def call(self, xs):
            partials = []
            for i, device in enumerate(self.devices):
                with tf.device(device):
                    partials.append(tf.matmul(xs[i], self.kernels[i]))
            with tf.device(self.devices[0]):  # the all-reduce of Megatron's row-parallel layer
                y = tf.add_n(partials)
                return y + self.bias if self.use_bias else y

        def get_config(self):
            return {**super().get_config(), "units": self.units, "devices": self.devices,
                    "use_bias": self.use_bias,
                    "kernel_initializer": keras.initializers.serialize(
                        keras.initializers.get(self.kernel_initializer))}

    @keras.saving.register_keras_serializable(package="tfdist")
    class ParallelMLP(keras.layers.Layer):
        """Dense(hidden_units, activation) -> Dense(units), split over `devices`.

        Equivalent to the two unsplit Dense layers; `dense_weights()` and
        `set_dense_weights()` convert from and to their [W1, b1, W2, b2].
        """

        def __init__(self, hidden_units, units, devices, activation="relu", **kwargs):
            super().__init__(**kwargs)
            self.hidden_units, self.units, self.devices = int(hidden_units), int(units), list(
                devices)
            self.activation = activation
            self.column = ColumnParallelDense(hidden_units, devices, activation=activation,
                                              name="column")
            self.row = RowParallelDense(units, devices, name="row")

        def build(self, input_shape):
            self.column.build(input_shape)
            self.row.build([(None, b - a) for a, b in self.column.bounds])

        def call(self, x):
            return self.row(self.column(x))

        def dense_weights(self):
            """[W1, b1, W2, b2] of the equivalent unsplit Dense pair, as NumPy arrays."""
            import numpy as np

            c, r = self.column, self.row
            return [np.concatenate([k.numpy() for k in c.kernels], axis=1),
                    np.concatenate([b.numpy() for b in c.biases]),
                    np.concatenate([k.numpy() for k in r.kernels], axis=0), r.bias.numpy()]

        def set_dense_weights(self, weights):
            """Loads [W1, b1, W2, b2] of an unsplit Dense pair into the shards."""
            w1, b1, w2, b2 = weights
            for (a, b), k, bias, k2 in zip(self.column.bounds, self.column.kernels,
                                           self.column.biases, self.row.kernels):
                k.assign(w1[:, a:b])
                bias.assign(b1[a:b])
                k2.assign(w2[a:b, :])
            self.row.bias.assign(b2)

        def get_config(self):
            return {**super().get_config(), "hidden_units": self.hidden_units,
                    "units": self.units, "devices": self.devices, "activation": self.activation}

    return ColumnParallelDense, RowParallelDense, ParallelMLP


def ColumnParallelDense(*args, **kwargs):  # noqa: N802 (a class, built lazily)
    """Builds a `ColumnParallelDense` layer; see `_classes`."""
    return _classes()[0](*args, **kwargs)


def RowParallelDense(*args, **kwargs):  # noqa: N802
    """Builds a `RowParallelDense` layer; see `_classes`."""
    return _classes()[1](*args, **kwargs)


def ParallelMLP(*args, **kwargs):  # noqa: N802
    """Builds a `ParallelMLP` layer (column- then row-parallel Dense); see `_classes`."""
    return _classes()[2](*args, **kwargs)


def register() -> None:
    """Registers the layer classes with Keras, so saved models that use them load."""
    _classes()
