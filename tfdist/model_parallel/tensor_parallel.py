"""Tensor parallelism (Megatron-LM style): Dense layers and attention heads split across devices.

`ColumnParallelDense` splits a kernel by output columns: device i holds
kernel[:, cols_i] and computes its slice of the activations, with no
communication. `RowParallelDense` takes those slices and splits its kernel by
input rows: device i computes x_i @ kernel[rows_i, :], and the partial sums
are added (the all-reduce; here a sum on the first device). `ParallelMLP`
chains the two, so an MLP block needs one reduction forward and one backward,
and each device holds 1/N of its parameters.

Each shard's forward and backward run on its device (`on_device`: a custom
gradient, since a GradientTape builds gradients where it is asked for them).

`HeadParallelAttention` does the same for keras.layers.MultiHeadAttention:
device i holds the query/key/value kernels of its heads (column-parallel,
the (d, heads, head_dim) kernels split along heads) and their rows of the
output projection (row-parallel, (heads, head_dim, d) split along heads),
computes its heads' attention, and the partial outputs are summed once.

Each layer replaces its plain Keras layer 1:1 (`from_layer`, `to_plain`);
whole models are split into these layers and gathered back by
`tfdist.model_parallel.surgery`.

Build them in a process whose devices exist (logical CPUs: configure_runtime).
"""

from __future__ import annotations

import functools
import math

from tfdist.model_parallel import plan


def _bounds(total: int, parts: int) -> list[tuple[int, int]]:
    """[start, stop) of each of `parts` near-equal shards of `total` (earlier ones larger)."""
    sizes, out, start = plan.even_split(total, parts), [], 0
    for size in sizes:
        out.append((start, start + size))
        start += size
    return out


@functools.lru_cache(maxsize=None)
def _classes():
    import keras
    import tensorflow as tf
    from keras import ops

    def sharded_init(initializer, full_shape, axis, start, stop):
        """An initializer for one shard of a weight drawn at its full shape.

        Drawing the full weight keeps fan-in/fan-out (and so the scale) of the
        unsplit layer.
        """
        cache = {}

        def init(shape, dtype=None):
            if "full" not in cache:
                cache["full"] = keras.initializers.get(initializer)(full_shape, dtype=dtype)
            index = (slice(None),) * axis + (slice(start, stop),)
            return cache["full"][index]

        return init

    def on_device(device, fn, *xs):
        """fn(*xs) with its forward and its backward ops on `device`.

        A GradientTape builds each op's gradient under the device scope of
        the `gradient` call (a stage's first device, in the pipeline), not
        where the op ran; this custom gradient takes the shard's own tape's
        gradient under `device`, so each shard's backward runs beside its
        forward. `xs` are the floating inputs to differentiate; `fn` may read
        variables and close over other tensors (masks).
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

    def serialize_init(initializer):
        return keras.initializers.serialize(keras.initializers.get(initializer))

    def check_plain(layer, kind, refused):
        """ValueError naming the first feature of `layer` a tensor-parallel copy lacks."""
        for attr, default, what in refused:
            value = getattr(layer, attr, default)
            if value != default and value is not default:
                raise ValueError(f"{kind} cannot replace layer {layer.name!r}: it has {what} "
                                 f"({attr}={value!r}). Received: {type(layer).__name__}. "
                                 "Leave that layer whole (no tensor parallelism).")

    class _TensorParallel(keras.layers.Layer):
        """What the tensor-parallel layers share: the plain layer's weights in and out."""

        _tfdist_tensor_parallel = True

        def _shard_weights(self):  # pragma: no cover - interface
            """[(variable, axis) or (variable, None) for a whole one], in plain-weight order."""
            raise NotImplementedError

        def plain_weights(self):
            """The weights of the equivalent plain layer (shards gathered), as NumPy arrays."""
            import numpy as np

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

    @keras.saving.register_keras_serializable(package="tfdist")
    class ColumnParallelDense(_TensorParallel):
        """Dense whose output columns are split over `devices`.

        Device i holds kernel[:, cols_i] and bias[cols_i] and computes its
        slice of the activations with no communication. With
        `gather_output=False` (Megatron's handoff, used by `ParallelMLP`) it
        returns the list of slices, each on its device, for a
        `RowParallelDense(input_is_parallel=True)`. With `gather_output=True`
        it returns their concatenation, one tensor shaped like the Dense's
        output, so that it replaces a Dense 1:1 in a Keras graph (a layer
        hands one tensor to the next). That costs what Megatron avoids: an
        all-gather of the activations forward (the concat, on the first
        device), then the next `RowParallelDense(input_is_parallel=False)`
        slices its part back out on each device (the backward of the concat
        is the same slicing, no reduction). The arithmetic is unchanged.

        Args:
            units: Output size of the whole (unsplit) layer.
            devices: Device names, one shard each.
            activation: Applied to each slice (elementwise, so split-safe).
            use_bias: Whether each shard has its slice of the bias.
            kernel_initializer: Drawn at the full (in, units) shape, then sliced.
            bias_initializer: Likewise, at (units,).
            gather_output: Return one concatenated tensor instead of the slices.
        """

        def __init__(self, units, devices, activation=None, use_bias=True,
                     kernel_initializer="glorot_uniform", bias_initializer="zeros",
                     gather_output=False, **kwargs):
            super().__init__(**kwargs)
            self.units, self.devices = int(units), list(devices)
            self.activation = keras.activations.get(activation)
            self.use_bias, self.kernel_initializer = use_bias, kernel_initializer
            self.bias_initializer, self.gather_output = bias_initializer, bool(gather_output)
            self.bounds = _bounds(self.units, len(self.devices))

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

        def call(self, x):
            def shard(i):
                def fn(x):
                    y = ops.matmul(x, self.kernels[i])
                    if self.use_bias:
                        y = ops.add(y, self.biases[i])
                    return self.activation(y)
                return fn

            outs = [on_device(device, shard(i), x) for i, device in enumerate(self.devices)]
            if not self.gather_output:
                return outs
            with tf.device(self.devices[0]):  # the all-gather Megatron's handoff avoids
                return ops.concatenate(outs, axis=-1)

        def compute_output_shape(self, input_shape):
            if self.gather_output:
                return (*input_shape[:-1], self.units)
            return [(*input_shape[:-1], b - a) for a, b in self.bounds]

        def get_config(self):
            return {**super().get_config(), "units": self.units, "devices": self.devices,
                    "activation": keras.activations.serialize(self.activation),
                    "use_bias": self.use_bias,
                    "kernel_initializer": serialize_init(self.kernel_initializer),
                    "bias_initializer": serialize_init(self.bias_initializer),
                    "gather_output": self.gather_output}

        @classmethod
        def from_layer(cls, dense, devices, gather_output=True):
            """The column-parallel copy of a built `keras.layers.Dense`, holding its weights.

            Raises:
                ValueError: for a Dense feature the copy lacks (a constraint,
                    LoRA, quantization), or more devices than units.
            """
            return _from_dense(cls, dense, devices, gather_output=gather_output)

        def _plain_groups(self):
            return [(self.kernels, 1)] + ([(self.biases, 0)] if self.use_bias else [])

        def _plain_class(self):
            return keras.layers.Dense

        def plain_config(self):
            """The config of the equivalent `keras.layers.Dense`."""
            return {**self._base_config(), "units": self.units,
                    "activation": keras.activations.serialize(self.activation),
                    "use_bias": self.use_bias,
                    "kernel_initializer": serialize_init(self.kernel_initializer),
                    "bias_initializer": serialize_init(self.bias_initializer)}

        def _build_plain(self, layer):
            layer.build((None, self.input_dim))

    @keras.saving.register_keras_serializable(package="tfdist")
    class RowParallelDense(_TensorParallel):
        """Dense whose input rows are split over `devices`.

        Device i multiplies its slice of the input features by kernel[rows_i, :];
        the partial products are summed on the first device (Megatron's
        all-reduce of a row-parallel layer), then the bias (held once, on the
        first device) and the activation are applied.

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
            super().__init__(**kwargs)
            self.units, self.devices = int(units), list(devices)
            self.activation = keras.activations.get(activation)
            self.use_bias, self.kernel_initializer = use_bias, kernel_initializer
            self.bias_initializer = bias_initializer
            self.input_is_parallel = bool(input_is_parallel)

        def build(self, input_shapes):
            if self.input_is_parallel:
                widths = [int(s[-1]) for s in input_shapes]
            else:
                widths = [b - a for a, b in _bounds(int(input_shapes[-1]), len(self.devices))]
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
            with tf.device(self.devices[0]):  # the all-reduce of Megatron's row-parallel layer
                y = tf.add_n(partials)
                if self.use_bias:
                    y = ops.add(y, self.bias)
                return self.activation(y)

        def compute_output_shape(self, input_shapes):
            shape = input_shapes[0] if self.input_is_parallel else input_shapes
            return (*shape[:-1], self.units)

        def get_config(self):
            return {**super().get_config(), "units": self.units, "devices": self.devices,
                    "activation": keras.activations.serialize(self.activation),
                    "use_bias": self.use_bias,
                    "kernel_initializer": serialize_init(self.kernel_initializer),
                    "bias_initializer": serialize_init(self.bias_initializer),
                    "input_is_parallel": self.input_is_parallel}

        @classmethod
        def from_layer(cls, dense, devices, input_is_parallel=False):
            """The row-parallel copy of a built `keras.layers.Dense`, holding its weights.

            Raises:
                ValueError: for a Dense feature the copy lacks, or more devices
                    than input features.
            """
            return _from_dense(cls, dense, devices, input_is_parallel=input_is_parallel)

        def _plain_groups(self):
            return [(self.kernels, 0)] + ([([self.bias], None)] if self.use_bias else [])

        _plain_class = ColumnParallelDense._plain_class
        plain_config = ColumnParallelDense.plain_config
        _build_plain = ColumnParallelDense._build_plain

    def _from_dense(cls, dense, devices, **kwargs):
        check_plain(dense, cls.__name__, _DENSE_REFUSED)
        if getattr(dense, "kernel", None) is None or len(dense.kernel.shape) != 2:
            raise ValueError(f"{cls.__name__}.from_layer needs a built keras.layers.Dense. "
                             f"Received: {type(dense).__name__} {dense.name!r}.")
        config = dense.get_config()
        layer = cls(config["units"], devices, activation=config["activation"],
                    use_bias=config["use_bias"],
                    kernel_initializer=config["kernel_initializer"],
                    bias_initializer=config["bias_initializer"], name=dense.name,
                    dtype=config.get("dtype"), trainable=dense.trainable, **kwargs)
        if cls is RowParallelDense and not layer.input_is_parallel:
            layer.build((None, int(dense.kernel.shape[0])))
        elif cls is RowParallelDense:
            layer.build([(None, b - a) for a, b in _bounds(int(dense.kernel.shape[0]),
                                                           len(layer.devices))])
        else:
            layer.build((None, int(dense.kernel.shape[0])))
        layer.set_plain_weights(dense.get_weights())
        return layer

    @keras.saving.register_keras_serializable(package="tfdist")
    class HeadParallelAttention(_TensorParallel):
        """keras.layers.MultiHeadAttention with its heads split over `devices`.

        Device i holds the query, key and value kernels (and biases) of its
        heads (column-parallel: the (d, heads, head_dim) kernels split along
        heads), and the same heads' rows of the output projection
        (row-parallel: (heads, head_dim, d) split along heads). It projects,
        attends and projects back its heads alone; the partial outputs are
        summed once on the first device (the forward all-reduce) and the
        output bias, held once there, is added. Each device's backward runs
        on it too (`on_device`); the backward all-reduce (of the input's
        gradient) is autodiff summing each device's contribution.
        Per head the computation is MultiHeadAttention's own
        (`keras.ops.dot_product_attention` with its scale and masks), so the
        two differ only in the order the heads' outputs are summed.

        Takes rank-3 inputs (batch, sequence, features) and MultiHeadAttention's
        call arguments (query, value, key, the Keras masks, attention_mask,
        use_causal_mask, training); not return_attention_scores, attention
        dropout, a gate, a sliding window, other attention axes or an
        output_shape (`from_layer` refuses a layer with them).

        Args:
            num_heads: Heads of the whole layer; each device takes a
                contiguous group (earlier devices one more when uneven).
            key_dim: Size of each query and key head.
            devices: Device names, one group of heads each.
            value_dim: Size of each value head (default key_dim).
            use_bias: Biases on the projections, as MultiHeadAttention's.
            kernel_initializer: Drawn at the full kernel shapes, then sliced.
            bias_initializer: Likewise.
        """

        def __init__(self, num_heads, key_dim, devices, value_dim=None, use_bias=True,
                     kernel_initializer="glorot_uniform", bias_initializer="zeros", **kwargs):
            super().__init__(**kwargs)
            self.supports_masking = True
            self.num_heads, self.key_dim = int(num_heads), int(key_dim)
            self.value_dim = int(value_dim or key_dim)
            self.devices, self.use_bias = list(devices), bool(use_bias)
            self.kernel_initializer, self.bias_initializer = kernel_initializer, bias_initializer
            if self.num_heads < len(self.devices):
                raise ValueError(f"HeadParallelAttention cannot split {self.num_heads} head(s) "
                                 f"over {len(self.devices)} devices: each needs at least one. "
                                 "Use a tensor-parallel degree of at most num_heads.")
            self.bounds = _bounds(self.num_heads, len(self.devices))

        def build(self, query_shape, value_shape, key_shape=None):
            key_shape = value_shape if key_shape is None else key_shape
            for what, shape in (("query", query_shape), ("value", value_shape),
                                ("key", key_shape)):
                if len(shape) != 3:
                    raise ValueError(f"HeadParallelAttention takes (batch, sequence, features) "
                                     f"inputs. Received: {what} shape {tuple(shape)}.")
            self.dims = {"query": int(query_shape[-1]), "key": int(key_shape[-1]),
                         "value": int(value_shape[-1])}
            n, out_dim = self.num_heads, self.dims["query"]
            self.shards = []
            for i, (device, (a, b)) in enumerate(zip(self.devices, self.bounds)):
                shard = {}
                with tf.device(device):
                    for proj, head_dim in (("query", self.key_dim), ("key", self.key_dim),
                                           ("value", self.value_dim)):
                        d = self.dims[proj]
                        shard[f"{proj}_kernel"] = self.add_weight(
                            shape=(d, b - a, head_dim), name=f"{proj}_kernel_{i}",
                            initializer=sharded_init(self.kernel_initializer, (d, n, head_dim),
                                                     1, a, b))
                        if self.use_bias:
                            shard[f"{proj}_bias"] = self.add_weight(
                                shape=(b - a, head_dim), name=f"{proj}_bias_{i}",
                                initializer=sharded_init(self.bias_initializer, (n, head_dim),
                                                         0, a, b))
                    shard["output_kernel"] = self.add_weight(
                        shape=(b - a, self.value_dim, out_dim), name=f"output_kernel_{i}",
                        initializer=sharded_init(self.kernel_initializer,
                                                 (n, self.value_dim, out_dim), 0, a, b))
                self.shards.append(shard)
            if self.use_bias:
                with tf.device(self.devices[0]):
                    self.output_bias = self.add_weight(shape=(out_dim,), name="output_bias",
                                                       initializer=self.bias_initializer)

        def _mask(self, query, value, query_mask, value_mask, key_mask, attention_mask,
                  use_causal_mask):
            """MultiHeadAttention's (B, T, S) boolean mask: Keras masks and causal one."""
            masks = []
            if query_mask is not None:
                masks.append(ops.expand_dims(ops.cast(query_mask, "bool"), -1))
            for m in (value_mask, key_mask):
                if m is not None:
                    masks.append(ops.expand_dims(ops.cast(m, "bool"), -2))
            if use_causal_mask:
                ones = ops.ones((1, ops.shape(query)[1], ops.shape(value)[1]), dtype="int32")
                masks.append(ops.greater_equal(ops.cumsum(ones, axis=-2),
                                               ops.cumsum(ones, axis=-1)))
            auto = None
            for m in masks:
                auto = m if auto is None else auto & m
            if attention_mask is not None:
                attention_mask = ops.cast(attention_mask, "bool")
            if auto is not None:
                attention_mask = auto if attention_mask is None else attention_mask & auto
            return attention_mask

        def call(self, query, value, key=None, query_mask=None, value_mask=None, key_mask=None,
                 attention_mask=None, return_attention_scores=False, training=None,
                 use_causal_mask=False):
            if return_attention_scores:
                raise ValueError("HeadParallelAttention does not return attention scores. "
                                 "Received: return_attention_scores=True.")
            key = value if key is None else key
            # MultiHeadAttention's routing: causal alone goes to the backend's causal kernel.
            causal_only = (use_causal_mask and attention_mask is None and query_mask is None
                           and value_mask is None and key_mask is None)
            mask = None
            if not causal_only:
                mask = self._mask(query, value, query_mask, value_mask, key_mask,
                                  attention_mask, use_causal_mask)
                if mask is not None:
                    for _ in range(4 - len(mask.shape)):  # (B, T, S) -> (B, 1, T, S)
                        mask = ops.expand_dims(mask, axis=-3)
                    mask = ops.cast(mask, "bool")
            scale = 1.0 / math.sqrt(float(self.key_dim))
            def heads(shard):
                def fn(*inputs):
                    projected = {}
                    for proj, x in zip(("query", "key", "value"), inputs):
                        y = ops.einsum("abc,cde->abde", x, shard[f"{proj}_kernel"])
                        if self.use_bias:
                            y = ops.add(y, shard[f"{proj}_bias"])
                        projected[proj] = y
                    out = ops.dot_product_attention(
                        projected["query"], projected["key"], projected["value"], mask=mask,
                        scale=scale, is_causal=causal_only)
                    return ops.einsum("abcd,cde->abe", out, shard["output_kernel"])
                return fn

            partials = [on_device(device, heads(shard), query, key, value)
                        for device, shard in zip(self.devices, self.shards)]
            with tf.device(self.devices[0]):  # the forward all-reduce of the heads' outputs
                y = tf.add_n(partials) if len(partials) > 1 else partials[0]
                return ops.add(y, self.output_bias) if self.use_bias else y

        def compute_output_shape(self, query_shape, value_shape, key_shape=None):
            return tuple(query_shape)

        def get_config(self):
            return {**super().get_config(), "num_heads": self.num_heads,
                    "key_dim": self.key_dim, "value_dim": self.value_dim,
                    "devices": self.devices, "use_bias": self.use_bias,
                    "kernel_initializer": serialize_init(self.kernel_initializer),
                    "bias_initializer": serialize_init(self.bias_initializer)}

        @classmethod
        def from_layer(cls, mha, devices):
            """The head-parallel copy of a built MultiHeadAttention, holding its weights.

            Raises:
                ValueError: for a feature the copy lacks (see the class), or
                    more devices than heads.
            """
            check_plain(mha, cls.__name__, _MHA_REFUSED)
            if getattr(mha, "_query_dense", None) is None:
                raise ValueError(f"{cls.__name__}.from_layer needs a built MultiHeadAttention. "
                                 f"Received: {type(mha).__name__} {mha.name!r} (unbuilt).")
            if mha._query_dense.equation != "abc,cde->abde":
                raise ValueError(f"{cls.__name__} takes (batch, sequence, features) inputs. "
                                 f"Received: layer {mha.name!r} built with projection "
                                 f"{mha._query_dense.equation!r}.")
            config = mha.get_config()
            layer = cls(mha.num_heads, mha.key_dim, devices, value_dim=mha.value_dim,
                        use_bias=mha.use_bias, kernel_initializer=config["kernel_initializer"],
                        bias_initializer=config["bias_initializer"], name=mha.name,
                        dtype=config.get("dtype"), trainable=mha.trainable)
            shapes = [(None, None, int(d.kernel.shape[0]))
                      for d in (mha._query_dense, mha._value_dense, mha._key_dense)]
            layer.build(*shapes)
            layer.set_plain_weights(mha.get_weights())
            return layer

        def _plain_groups(self):
            groups = []
            for proj in ("query", "key", "value"):
                groups.append(([s[f"{proj}_kernel"] for s in self.shards], 1))
                if self.use_bias:
                    groups.append(([s[f"{proj}_bias"] for s in self.shards], 0))
            groups.append(([s["output_kernel"] for s in self.shards], 0))
            if self.use_bias:
                groups.append(([self.output_bias], None))
            return groups

        def _plain_class(self):
            return keras.layers.MultiHeadAttention

        def plain_config(self):
            """The config of the equivalent `keras.layers.MultiHeadAttention`."""
            return {**self._base_config(), "num_heads": self.num_heads,
                    "key_dim": self.key_dim, "value_dim": self.value_dim,
                    "use_bias": self.use_bias,
                    "kernel_initializer": serialize_init(self.kernel_initializer),
                    "bias_initializer": serialize_init(self.bias_initializer)}

        def _build_plain(self, layer):
            layer.build((None, None, self.dims["query"]), (None, None, self.dims["value"]),
                        (None, None, self.dims["key"]))

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
            return [*self.column.plain_weights(), *self.row.plain_weights()]

        def set_dense_weights(self, weights):
            """Loads [W1, b1, W2, b2] of an unsplit Dense pair into the shards."""
            self.column.set_plain_weights(weights[:2])
            self.row.set_plain_weights(weights[2:])

        def get_config(self):
            return {**super().get_config(), "hidden_units": self.hidden_units,
                    "units": self.units, "devices": self.devices, "activation": self.activation}

    return ColumnParallelDense, RowParallelDense, ParallelMLP, HeadParallelAttention


# Features of a plain layer its tensor-parallel copy lacks: (attribute, plain value, what).
_DENSE_REFUSED = (("kernel_constraint", None, "a kernel constraint"),
                  ("bias_constraint", None, "a bias constraint"),
                  ("lora_enabled", False, "LoRA"),
                  ("quantization_mode", None, "quantization"))
_MHA_REFUSED = (("_dropout", 0.0, "attention dropout"),
                ("_use_gate", False, "a gate"),
                ("_output_shape", None, "an output_shape"),
                ("_sliding_window", None, "a sliding window"),
                ("_kernel_constraint", None, "a kernel constraint"),
                ("_bias_constraint", None, "a bias constraint"),
                ("_kernel_regularizer", None, "a kernel regularizer"),
                ("_bias_regularizer", None, "a bias regularizer"))


def ParallelMLP(*args, **kwargs):  # noqa: N802
    """Builds a `ParallelMLP` layer (column- then row-parallel Dense); see `_classes`."""
    return _classes()[2](*args, **kwargs)


def layer_classes() -> dict:
    """name -> class of the tensor-parallel layers (for `from_layer` and isinstance)."""
    names = ("ColumnParallelDense", "RowParallelDense", "ParallelMLP", "HeadParallelAttention")
    return dict(zip(names, _classes()))


def is_tensor_parallel(layer) -> bool:
    """Whether `layer` is one of the 1:1 tensor-parallel replacements (it has `to_plain`)."""
    return bool(getattr(layer, "_tfdist_tensor_parallel", False))


# Optimizers whose step for a variable reads the whole variable, not each element alone:
# LAMB's trust ratio ||w|| / ||update||; Adafactor's step scaled by the RMS of the weight
# and of the update, and its second moment factored into the means of rows and columns;
# Muon's orthogonalised matrix. On a shard they compute these over the shard.
WHOLE_WEIGHT_OPTIMIZERS = ("Lamb", "Adafactor", "Muon")


def check_optimizer(optimizer, layers) -> None:
    """Refuses an optimizer that would step tensor-parallel shards unlike their whole weight.

    Keras optimizers update each variable alone, and a tensor-parallel layer
    holds each plain weight as shards, one variable per device. An
    elementwise update (SGD, Adam, RMSprop, Lion, ...) and `global_clipnorm`
    (one norm over every variable) take the same step on the shards as on
    the weight. Per-variable `clipnorm` and the `WHOLE_WEIGHT_OPTIMIZERS` do
    not: each shard would be clipped or scaled by its own statistics. Measured
    on the equality matrix's models, 6 steps, 2-way: LAMB ends up to 1.6e-3
    (absolute) from one device and Adafactor up to 1.7, against 1e-5 for
    every elementwise optimizer.

    Args:
        optimizer: The compiled optimizer (a LossScaleOptimizer is looked through).
        layers: The model's layers; nothing is refused without a tensor-parallel one.

    Raises:
        ConfigError: naming the optimizer, the first split layer and what to use instead.
    """
    import keras

    from tfdist.errors import ConfigError

    split = [layer.name for layer in layers if is_tensor_parallel(layer)]
    if not split:
        return
    where = f"tensor-parallel layers ({split[0]!r} and {len(split) - 1} more)"
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if getattr(inner, "clipnorm", None):
        raise ConfigError(
            f"The optimizer clips each variable by its own norm (clipnorm="
            f"{inner.clipnorm}), but {where} hold each weight as shards, so each shard would "
            "be clipped alone. Use global_clipnorm (tfdist's --clipnorm is global), "
            "or no tensor parallelism.")
    for name in WHOLE_WEIGHT_OPTIMIZERS:
        cls = getattr(keras.optimizers, name, None)
        if cls is not None and isinstance(inner, cls):
            raise ConfigError(
                f"{type(inner).__name__} scales each variable's step by statistics of the "
                f"whole variable, but {where} hold each weight as shards, so each shard "
                "would take its own step, unlike one device. Use an elementwise optimizer "
                "(adam, adamw, sgd, rmsprop, lion, ...) or no tensor parallelism.")
