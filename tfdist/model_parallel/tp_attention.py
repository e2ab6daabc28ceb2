"""Attention split by heads over devices (Megatron-LM's parallel self-attention).

`HeadParallelAttention` replaces keras.layers.MultiHeadAttention 1:1: device i
holds the query/key/value kernels of its heads (column-parallel, the
(d, heads, head_dim) kernels split along heads) and their rows of the output
projection (row-parallel, (heads, head_dim, d) split along heads), computes
its heads' attention, and the partial outputs are summed once
(`tp_ops.all_reduce`).

Imports TensorFlow and Keras; build the layer in a process whose devices exist.
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf
from keras import ops

from tfdist.model_parallel.plan import shard_bounds
from tfdist.model_parallel.tp_layers import TensorParallelLayer, check_plain
from tfdist.model_parallel.tp_ops import all_reduce, on_device, serialize_init, sharded_init

# Features of a MultiHeadAttention its head-parallel copy lacks: (attribute, plain value, what).
MHA_REFUSED = (("_dropout", 0.0, "attention dropout"),
               ("_use_gate", False, "a gate"),
               ("_output_shape", None, "an output_shape"),
               ("_sliding_window", None, "a sliding window"),
               ("_kernel_constraint", None, "a kernel constraint"),
               ("_bias_constraint", None, "a bias constraint"),
               ("_kernel_regularizer", None, "a kernel regularizer"),
               ("_bias_regularizer", None, "a bias regularizer"))


@keras.saving.register_keras_serializable(package="tfdist")
class HeadParallelAttention(TensorParallelLayer):
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
        self.bounds = shard_bounds(self.num_heads, len(self.devices))

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
        self._annotate_shards()

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
        y = all_reduce(partials, self.devices[0])  # the forward all-reduce of the heads
        with tf.device(self.devices[0]):
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
    def from_layer(cls, mha, devices, with_weights=True):
        """The head-parallel copy of a built MultiHeadAttention, holding its weights
        (unless `with_weights` is False: a model built without values gets them later).

        Raises:
            ValueError: for a feature the copy lacks (see the class), or
                more devices than heads.
        """
        check_plain(mha, cls.__name__, MHA_REFUSED)
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
        if with_weights:
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

    def _plain_names(self):
        names = []
        for proj in ("query", "key", "value"):
            names += [f"{proj}/kernel"] + ([f"{proj}/bias"] if self.use_bias else [])
        return names + ["attention_output/kernel"] + (
            ["attention_output/bias"] if self.use_bias else [])

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
