"""Tensor-parallel Dense layers (Megatron-LM's column- and row-parallel linear layers).

`ColumnParallelDense` splits a kernel by output columns: device i holds
kernel[:, cols_i] and computes its slice of the activations, with no
communication. `RowParallelDense` takes those slices and splits its kernel by
input rows: device i computes x_i @ kernel[rows_i, :], and the partial sums
are added (`tp_ops.all_reduce`). `ParallelMLP` chains the two, so an MLP block
needs one reduction forward and one backward, and each device holds 1/N of its
parameters.

Every layer here derives from `TensorParallelLayer`: it replaces its plain
Keras layer 1:1 (`from_layer`, `to_plain`) and converts the plain layer's
weights to and from its shards, which is all that model surgery
(`tfdist.model_parallel.surgery`) and the optimizer check need.

Imports TensorFlow and Keras; build the layers in a process whose devices
exist (logical CPUs: configure_runtime).
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from tfdist.model_parallel.plan import shard_bounds
from tfdist.model_parallel.tp_ops import (all_gather, all_reduce, on_device, serialize_init,
                                          sharded_init)

# Features of a plain Dense its tensor-parallel copy lacks: (attribute, plain value, what).
DENSE_REFUSED = (("kernel_constraint", None, "a kernel constraint"),
                 ("bias_constraint", None, "a bias constraint"),
                 ("lora_enabled", False, "LoRA"),
                 ("quantization_mode", None, "quantization"))


def check_plain(layer, kind, refused):
    """ValueError naming the first feature of `layer` a tensor-parallel copy lacks."""
    for attr, default, what in refused:
        value = getattr(layer, attr, default)
        if value != default and value is not default:
            raise ValueError(f"{kind} cannot replace layer {layer.name!r}: it has {what} "
                             f"({attr}={value!r}). Received: {type(layer).__name__}. "
                             "Leave that layer whole (no tensor parallelism).")


class TensorParallelLayer(keras.layers.Layer):
    """What the tensor-parallel layers share: the plain layer's weights in and out.

    A subclass lists its shards as `_plain_groups()`: for each weight of the
    plain layer (in `get_weights()` order), its shard variables and the axis
    they split (None: one whole variable), and names its plain equivalent
    (`_plain_class`, `plain_config`, `_build_plain`).
    """

    _tfdist_tensor_parallel = True

    def _plain_groups(self):  # pragma: no cover - interface
        raise NotImplementedError

    def _annotate_shards(self):
        """Marks each shard variable with the plain weight it is a slice of ([plain path,
        axis, start, stop, plain shape]): what a backup records to resume under another
        tensor-parallel degree (`tfdist.reshard`). Call at the end of `build`."""
        for (group, axis), name in zip(self._plain_groups(), self._plain_names()):
            prefix = group[0].path.rsplit("/", 1)[0]
            if axis is None:  # held whole, maybe under another name (output_bias)
                group[0]._tfdist_plain = (f"{prefix}/{name}", None, 0, 0,
                                          tuple(group[0].shape))
                continue
            shape = list(group[0].shape)
            shape[axis] = sum(int(v.shape[axis]) for v in group)
            start = 0
            for v in group:
                stop = start + int(v.shape[axis])
                v._tfdist_plain = (f"{prefix}/{name}", axis, start, stop, tuple(shape))
                start = stop

    def shard_devices(self):
        """For each plain weight (`_plain_groups` order), the device of each of its shards:
        shard i on devices[i], a weight held whole on devices[0]."""
        return [[self.devices[0]] if axis is None else self.devices[:len(group)]
                for group, axis in self._plain_groups()]

    def plain_weights(self):
        """The weights of the equivalent plain layer (shards gathered), as NumPy arrays."""
        out = []
        for group, axis in self._plain_groups():
            values = [v.numpy() for v in group]
            out.append(values[0] if axis is None else np.concatenate(values, axis=axis))
        return out

    def set_plain_weights(self, weights):
        """Loads the plain layer's weights (`get_weights()` order) into the shards."""
        groups = self._plain_groups()
        if len(weights) != len(groups):
            raise ValueError(f"{self.name}: expected {len(groups)} plain weights. "
                             f"Received: {len(weights)}.")
        for (group, axis), value in zip(groups, weights):
            if axis is None:
                group[0].assign(value)
                continue
            start = 0
            for v in group:
                stop = start + v.shape[axis]
                v.assign(value[(slice(None),) * axis + (slice(start, stop),)])
                start = stop
            if start != value.shape[axis]:
                raise ValueError(f"{self.name}: a plain weight of shape {value.shape} does "
                                 f"not match shards adding up to {start} on axis {axis}.")

    def to_plain(self):
        """The equivalent plain Keras layer, built, holding the gathered weights."""
        layer = self._plain_class().from_config(self.plain_config())
        self._build_plain(layer)
        layer.set_weights(self.plain_weights())
        return layer

    def _base_config(self):
        base = keras.layers.Layer.get_config(self)
        return {k: base[k] for k in ("name", "trainable", "dtype") if k in base}


class _DenseShards(TensorParallelLayer):
    """The arguments, config and plain equivalent the two Dense shardings share."""

    def __init__(self, units, devices, activation=None, use_bias=True,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        self.units, self.devices = int(units), list(devices)
        self.activation = keras.activations.get(activation)
        self.use_bias, self.kernel_initializer = use_bias, kernel_initializer
        self.bias_initializer = bias_initializer

    def get_config(self):
        return {**super().get_config(), "units": self.units, "devices": self.devices,
                "activation": keras.activations.serialize(self.activation),
                "use_bias": self.use_bias,
                "kernel_initializer": serialize_init(self.kernel_initializer),
                "bias_initializer": serialize_init(self.bias_initializer)}

    def _plain_class(self):
        return keras.layers.Dense

    def _plain_names(self):
        return ["kernel", "bias"][:len(self._plain_groups())]

    def plain_config(self):
        """The config of the equivalent `keras.layers.Dense`."""
        return {**self._base_config(), "units": self.units,
                "activation": keras.activations.serialize(self.activation),
                "use_bias": self.use_bias,
                "kernel_initializer": serialize_init(self.kernel_initializer),
                "bias_initializer": serialize_init(self.bias_initializer)}

    def _build_plain(self, layer):
        layer.build((None, self.input_dim))

    @classmethod
    def _from_dense(cls, dense, devices, with_weights=True, **kwargs):
        """The copy of a built Dense over `devices`, built (holding its weights unless
        `with_weights` is False: a model built without values gets them later)."""
        check_plain(dense, cls.__name__, DENSE_REFUSED)
        if getattr(dense, "kernel", None) is None or len(dense.kernel.shape) != 2:
            raise ValueError(f"{cls.__name__}.from_layer needs a built keras.layers.Dense. "
                             f"Received: {type(dense).__name__} {dense.name!r}.")
        config = dense.get_config()
        layer = cls(config["units"], devices, activation=config["activation"],
                    use_bias=config["use_bias"],
                    kernel_initializer=config["kernel_initializer"],
                    bias_initializer=config["bias_initializer"], name=dense.name,
                    dtype=config.get("dtype"), trainable=dense.trainable, **kwargs)
        layer.build(layer._input_shape_for(int(dense.kernel.shape[0])))
        if with_weights:
            layer.set_plain_weights(dense.get_weights())
        return layer


@keras.saving.register_keras_serializable(package="tfdist")
class ColumnParallelDense(_DenseShards):
    """Dense whose output columns are split over `devices`.

    Device i holds kernel[:, cols_i] and bias[cols_i] and computes its slice of
    the activations with no communication. With `gather_output=False`
    (Megatron's handoff, used by `ParallelMLP`) it returns the list of slices,
    each on its device, for a `RowParallelDense(input_is_parallel=True)`. With
    `gather_output=True` it returns their `all_gather`, one tensor shaped like
    the Dense's output, so that it replaces a Dense 1:1 in a Keras graph (a
    layer hands one tensor to the next); the next
    `RowParallelDense(input_is_parallel=False)` then slices its part back out
    on each device. The arithmetic is the same either way.

    Args:
        units: Output size of the whole (unsplit) layer.
        devices: Device names, one shard each.
        activation: Applied to each slice (elementwise, so split-safe).
        use_bias: Whether each shard has its slice of the bias.
        kernel_initializer: Drawn at the full (in, units) shape, then sliced.
        bias_initializer: Likewise, at (units,).
        gather_output: Return one gathered tensor instead of the slices.
    """

    def __init__(self, units, devices, activation=None, use_bias=True,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 gather_output=False, **kwargs):
        super().__init__(units, devices, activation, use_bias, kernel_initializer,
                         bias_initializer, **kwargs)
        self.gather_output = bool(gather_output)
        self.bounds = shard_bounds(self.units, len(self.devices))

    def _input_shape_for(self, fan_in):
        return (None, fan_in)

    def build(self, input_shape):
        fan_in = int(input_shape[-1])
        self.input_dim = fan_in
        self.kernels, self.biases = [], []
        for i, (device, (a, b)) in enumerate(zip(self.devices, self.bounds)):
            with tf.device(device):
                self.kernels.append(self.add_weight(
                    shape=(fan_in, b - a), name=f"kernel_{i}",
                    initializer=sharded_init(self.kernel_initializer, (fan_in, self.units),
                                             1, a, b)))
                if self.use_bias:
                    self.biases.append(self.add_weight(
                        shape=(b - a,), name=f"bias_{i}",
                        initializer=sharded_init(self.bias_initializer, (self.units,),
                                                 0, a, b)))
        self._annotate_shards()

    def call(self, x):
        def shard(i):
            def fn(x):
                y = ops.matmul(x, self.kernels[i])
                if self.use_bias:
                    y = ops.add(y, self.biases[i])
                return self.activation(y)
            return fn

        outs = [on_device(device, shard(i), x) for i, device in enumerate(self.devices)]
        return all_gather(outs, self.devices[0]) if self.gather_output else outs

    def compute_output_shape(self, input_shape):
        if self.gather_output:
            return (*input_shape[:-1], self.units)
        return [(*input_shape[:-1], b - a) for a, b in self.bounds]

    def get_config(self):
        return {**super().get_config(), "gather_output": self.gather_output}

    @classmethod
    def from_layer(cls, dense, devices, gather_output=True, with_weights=True):
        """The column-parallel copy of a built `keras.layers.Dense`, holding its weights
        (unless `with_weights` is False).

        Raises:
            ValueError: for a Dense feature the copy lacks (a constraint,
                LoRA, quantization), or more devices than units.
        """
        return cls._from_dense(dense, devices, with_weights, gather_output=gather_output)

    def _plain_groups(self):
        return [(self.kernels, 1)] + ([(self.biases, 0)] if self.use_bias else [])


@keras.saving.register_keras_serializable(package="tfdist")
class RowParallelDense(_DenseShards):
    """Dense whose input rows are split over `devices`.

    Device i multiplies its slice of the input features by kernel[rows_i, :];
    the partial products are summed on the first device (`all_reduce`,
    Megatron's all-reduce of a row-parallel layer), then the bias (held once,
    on the first device) and the activation are applied.

    Args:
        units: Output size.
        devices: Device names; input slice i is multiplied on device i.
        activation: Applied after the sum.
        use_bias: One bias, added once after the sum (on the first device).
        kernel_initializer: Drawn at the full (in, units) shape, then sliced.
        bias_initializer: Of the one bias.
        input_is_parallel: Take the list of slices a
            `ColumnParallelDense(gather_output=False)` returns (Megatron's
            handoff); False: take one tensor and slice it on each device.
    """

    def __init__(self, units, devices, activation=None, use_bias=True,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 input_is_parallel=True, **kwargs):
        super().__init__(units, devices, activation, use_bias, kernel_initializer,
                         bias_initializer, **kwargs)
        self.input_is_parallel = bool(input_is_parallel)

    def _input_shape_for(self, fan_in):
        if self.input_is_parallel:
            return [(None, b - a) for a, b in shard_bounds(fan_in, len(self.devices))]
        return (None, fan_in)

    def build(self, input_shapes):
        if self.input_is_parallel:
            widths = [int(s[-1]) for s in input_shapes]
        else:
            widths = [b - a for a, b in shard_bounds(int(input_shapes[-1]), len(self.devices))]
        if len(widths) != len(self.devices):
            raise ValueError(f"RowParallelDense over {len(self.devices)} devices needs "
                             f"{len(self.devices)} input slices. Received {len(widths)}.")
        fan_in, start, self.kernels, self.input_bounds = sum(widths), 0, [], []
        self.input_dim = fan_in
        for i, (device, w) in enumerate(zip(self.devices, widths)):
            with tf.device(device):
                self.kernels.append(self.add_weight(
                    shape=(w, self.units), name=f"kernel_{i}",
                    initializer=sharded_init(self.kernel_initializer, (fan_in, self.units),
                                             0, start, start + w)))
            self.input_bounds.append((start, start + w))
            start += w
        if self.use_bias:
            with tf.device(self.devices[0]):
                self.bias = self.add_weight(shape=(self.units,), name="bias",
                                            initializer=self.bias_initializer)
        self._annotate_shards()

    def call(self, xs):
        def shard(i):
            def fn(x):
                if not self.input_is_parallel:
                    a, b = self.input_bounds[i]
                    x = x[..., a:b]
                return ops.matmul(x, self.kernels[i])
            return fn

        partials = [on_device(device, shard(i), xs[i] if self.input_is_parallel else xs)
                    for i, device in enumerate(self.devices)]
        y = all_reduce(partials, self.devices[0])
        with tf.device(self.devices[0]):
            if self.use_bias:
                y = ops.add(y, self.bias)
            return self.activation(y)

    def compute_output_shape(self, input_shapes):
        shape = input_shapes[0] if self.input_is_parallel else input_shapes
        return (*shape[:-1], self.units)

    def get_config(self):
        return {**super().get_config(), "input_is_parallel": self.input_is_parallel}

    @classmethod
    def from_layer(cls, dense, devices, input_is_parallel=False, with_weights=True):
        """The row-parallel copy of a built `keras.layers.Dense`, holding its weights
        (unless `with_weights` is False).

        Raises:
            ValueError: for a Dense feature the copy lacks, or more devices
                than input features.
        """
        return cls._from_dense(dense, devices, with_weights,
                               input_is_parallel=input_is_parallel)

    def _plain_groups(self):
        return [(self.kernels, 0)] + ([([self.bias], None)] if self.use_bias else [])


@keras.saving.register_keras_serializable(package="tfdist")
class ParallelMLP(TensorParallelLayer):
    """Dense(hidden_units, activation) -> Dense(units), split over `devices`.

    Megatron's MLP block: a `ColumnParallelDense` hands its slices straight to
    a `RowParallelDense` (no all-gather between them). Its plain equivalent is
    a `keras.Sequential` of the two Dense layers (`to_plain`); `dense_weights()`
    and `set_dense_weights()` are their [W1, b1, W2, b2].
    """

    def __init__(self, hidden_units, units, devices, activation="relu", **kwargs):
        super().__init__(**kwargs)
        self.hidden_units, self.units = int(hidden_units), int(units)
        self.devices, self.activation = list(devices), activation
        self.column = ColumnParallelDense(hidden_units, devices, activation=activation,
                                          name="column")
        self.row = RowParallelDense(units, devices, name="row")

    def build(self, input_shape):
        self.input_dim = int(input_shape[-1])
        self.column.build(input_shape)
        self.row.build([(None, b - a) for a, b in self.column.bounds])

    def call(self, x):
        return self.row(self.column(x))

    def _plain_groups(self):
        return [*self.column._plain_groups(), *self.row._plain_groups()]

    def _plain_names(self):
        return [*(f"column/{n}" for n in self.column._plain_names()),
                *(f"row/{n}" for n in self.row._plain_names())]

    def dense_weights(self):
        """[W1, b1, W2, b2] of the equivalent unsplit Dense pair, as NumPy arrays."""
        return self.plain_weights()

    def set_dense_weights(self, weights):
        """Loads [W1, b1, W2, b2] of an unsplit Dense pair into the shards."""
        self.set_plain_weights(weights)

    def to_plain(self):
        """The equivalent `keras.Sequential([Dense, Dense])`, built, with the gathered weights."""
        plain = keras.Sequential([
            keras.layers.Dense(self.hidden_units, activation=self.activation, name="column"),
            keras.layers.Dense(self.units, name="row")], name=self.name)
        plain.build((None, self.input_dim))
        plain.set_weights(self.plain_weights())
        return plain

    def get_config(self):
        return {**super().get_config(), "hidden_units": self.hidden_units,
                "units": self.units, "devices": self.devices, "activation": self.activation}
