"""Dense layers' weight gradients taken once per step, over all of its micro-batches.

A pipeline cuts each batch into M micro-batches. Taking a Dense layer's
kernel gradient per micro-batch (`x_i^T dz_i`, K = rows / M) and adding it to
a running sum writes and re-reads the whole kernel 2M times a step: on a CPU
at 32-row micro-batches of a 2048 x 2048 layer those passes over memory cost
more than the arithmetic (`bench pipeline-processes --parts timeline`, #50).
The kernel's gradient is linear in the rows, so it is also
`concat(x_i)^T concat(dz_i)`: one matmul at the step's end over the batch's
rows, as one process computes it, with no running sum and no second gradient
set alive beside it. What a micro-batch's backward still makes is the
gradient of the layer's pre-activation `dz_i` (and its input's), which the
stage's backward returns; the inputs `x_i` are kept until the step's end.

That trade (the batch's inputs and pre-activation gradients kept instead of
two kernel-sized tensors per micro-batch) pays where the kernel outweighs
them: `worth_batching`. Only plain `keras.layers.Dense` calls whose weights
are read as stored (no mixed-precision autocast, LoRA or quantization) and
carry no regularizer are taken this way; every other layer keeps its
per-micro-batch gradients, as does every layer under zero bubble, whose point is
to run each micro-batch's weight gradient where a stage would otherwise idle.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass
class DenseCall:
    """One micro-batch's call of a Dense layer whose weight gradients wait.

    Attributes:
        layer: The Dense layer.
        x: Its input.
        z: Its pre-activation output (`x @ kernel + bias`).
        dz: The gradient of `z`, set by the stage's backward (None: none flowed).
    """

    layer: object
    x: object
    z: object
    dz: object = None


@dataclasses.dataclass
class MicrobatchCalls:
    """The Dense calls of one micro-batch through one stage whose weight gradients wait.

    Attributes:
        microbatches: M, the step's micro-batches per copy (the rows a batched
            gradient covers are M times a call's).
        calls: The `DenseCall`s, in call order.
    """

    microbatches: int
    calls: list = dataclasses.field(default_factory=list)

    def takes(self, layer, x) -> bool:
        """Whether this call of `layer` on `x` is batched (`plain_dense`, `worth_batching`)."""
        if not plain_dense(layer) or getattr(x, "_keras_mask", None) is not None:
            return False
        rows = call_rows(x.shape)
        return worth_batching(None if rows is None else rows * self.microbatches, *units(layer))

    def call(self, layer, x):
        """`call`, recording the call; returns the layer's output."""
        out, z = call(layer, x)
        self.calls.append(DenseCall(layer, x, z))
        return out


def in_schedule(schedule, microbatches: int) -> bool:
    """Pure function: whether a schedule's steps take batched weight gradients: over
    several micro-batches, and not zero bubble (a schedule with input-gradient "I"
    actions, whose point is to run each micro-batch's W where a stage would idle)."""
    return microbatches > 1 and not any(a[0] == "I" for actions in schedule for a in actions)


def units(layer) -> tuple[int, int]:
    """A Dense layer's kernel dimensions (in, out)."""
    return int(layer.kernel.shape[0]), int(layer.kernel.shape[-1])


def call_rows(shape) -> int | None:
    """Pure function: the rows a Dense call multiplies (every axis but the last), None
    when the trace does not know one of them."""
    dims = list(shape)[:-1]
    return None if any(d is None for d in dims) else math.prod(int(d) for d in dims)


def most_microbatches(rows: int | None, units_in: int, units_out: int) -> int:
    """Pure function: the largest M for which `worth_batching(M * rows, ...)` holds
    (M * rows * (in + out) <= in * out); 0 with unknown or no rows."""
    return (units_in * units_out) // ((units_in + units_out) * rows) if rows else 0


def worth_batching(rows: int | None, units_in: int, units_out: int) -> bool:
    """Pure function: whether a Dense layer's weight gradient is better taken once a step.

    Batched, a step keeps its `rows` inputs and pre-activation gradients
    (rows x (in + out) floats) until its end; per micro-batch, it writes a
    kernel-sized gradient and adds it to a running sum each micro-batch. Batch
    where the kept rows are at most the kernel's size; an unknown row count
    (a batch whose size the trace does not know) keeps the per-micro-batch path.

    Args:
        rows: Rows of one step of this pipeline copy (all its micro-batches).
        units_in: The kernel's first dimension.
        units_out: Its second.
    """
    return rows is not None and rows * (units_in + units_out) <= units_in * units_out


def plain_dense(layer) -> bool:
    """Whether `layer` is a Dense layer whose call is `Dense.call` on its stored weights."""
    import keras

    dense = keras.layers.Dense
    if not isinstance(layer, dense) or type(layer).call is not dense.call:
        return False
    policy = layer.dtype_policy
    # A regularizer's loss reaches its weights through the last stage's tape, and an
    # activity regularizer is added by Layer.__call__, which `call` does not go through.
    regularized = any(getattr(layer, name, None) is not None for name in (
        "kernel_regularizer", "bias_regularizer", "activity_regularizer"))
    return (not getattr(layer, "lora_enabled", False)
            and getattr(layer, "quantization_mode", None) is None
            and policy.compute_dtype == policy.variable_dtype and not regularized)


def call(layer, x):
    """`Dense.call`'s ops on `x`, keeping the pre-activation.

    Returns:
        (the layer's output, its pre-activation `z`).
    """
    from keras import ops

    z = ops.matmul(x, layer.kernel)
    if layer.bias is not None:
        z = ops.add(z, layer.bias)
    return (layer.activation(z) if layer.activation is not None else z), z


def gradients(layer, calls: list[DenseCall]) -> dict[int, object]:
    """The layer's weight gradients over `calls` (every micro-batch's call of it in a step).

    Returns:
        {id(variable): its gradient} for the kernel and the bias; empty when no
        gradient flowed into any call.
    """
    import tensorflow as tf

    flowed = [c for c in calls if c.dz is not None]
    if not flowed:
        return {}
    units_in, units_out = units(layer)
    with tf.name_scope("batched_weight_grads"):  # a kind of its own in bench timelines
        x = tf.concat([tf.reshape(c.x, [-1, units_in]) for c in flowed], 0)
        dz = tf.concat([tf.reshape(c.dz, [-1, units_out]) for c in flowed], 0)
        out = {id(layer.kernel): tf.matmul(x, dz, transpose_a=True)}
        if layer.bias is not None:
            out[id(layer.bias)] = tf.reduce_sum(dz, 0)
    return out
