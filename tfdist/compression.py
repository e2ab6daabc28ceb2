"""Gradient compression: cast before the all-reduce, back after (`--grad-compression`).

Why: a data-parallel step sends every gradient byte; float16 or bfloat16 on
the wire halves that, which pays where the all-reduce is bandwidth-bound
(slow links between hosts, large models) and costs two casts per gradient
where it is not. Only floating gradients wider than the wire type are cast
(a float16 gradient under mixed precision already is). float16 keeps 10
mantissa bits but overflows past 65504; bfloat16 keeps float32's range with
7 bits. No error feedback.

Where the sum happens: shm sends the wire type through its segment but sums
and averages in float32 (`tfdist.shm.comm.accumulator_dtype`), rounding once,
so a mean whose partial sums pass 65504 stays finite. MultiWorkerMirrored's
collective ops and Horovod's Gloo/MPI reduce in the tensor's own dtype, and
neither has an option to accumulate wider than what it sends: there every
add rounds to the wire type and a sum past 65504 is inf (the mean is taken
after the sum).

One function serves every engine: MultiWorkerMirrored and Mirrored through
`tfdist.compat.keras_grad_reduction`, Horovod and shm through
`tfdist.allreduce_optimizer`.
"""

from __future__ import annotations

from typing import Callable

from tfdist.errors import ConfigError

NAMES = ("none", "fp16", "bf16")
_WIRE = {"fp16": "float16", "bf16": "bfloat16"}


def check(name: str) -> str:
    """Returns `name` when it is a known compression.

    Raises:
        ConfigError: for any other value, listing the known ones.
    """
    if name not in NAMES:
        raise ConfigError(f"--grad-compression must be one of {', '.join(NAMES)}. "
                          f"Received: {name!r}.")
    return name


def wire_bytes(nbytes: int, name: str) -> int:
    """Pure function: bytes float32 gradients of `nbytes` put on the wire under `name`
    (the 2-byte wire types halve them)."""
    return nbytes // 2 if check(name) != "none" else nbytes


def compress(grads: list, name: str) -> tuple[list, list]:
    """Casts floating gradients wider than the wire type; returns them and the dtypes to restore.

    None entries and non-floating tensors pass unchanged; IndexedSlices keep
    their indices and have their values cast.
    """
    if check(name) == "none":
        return list(grads), [None] * len(grads)
    import tensorflow as tf

    wire = tf.as_dtype(_WIRE[name])
    out, restore = [], []
    for g in grads:
        dtype = None if g is None else g.dtype
        if dtype is None or not dtype.is_floating or dtype.size <= wire.size:
            out.append(g)
            restore.append(None)
        elif isinstance(g, tf.IndexedSlices):
            out.append(tf.IndexedSlices(tf.cast(g.values, wire), g.indices, g.dense_shape))
            restore.append(dtype)
        else:
            out.append(tf.cast(g, wire))
            restore.append(dtype)
    return out, restore


def decompress(grads: list, restore: list) -> list:
    """Casts each gradient back to the dtype `compress` recorded for it."""
    import tensorflow as tf

    out = []
    for g, dtype in zip(grads, restore):
        if dtype is None or g is None:
            out.append(g)
        elif isinstance(g, tf.IndexedSlices):
            out.append(tf.IndexedSlices(tf.cast(g.values, dtype), g.indices, g.dense_shape))
        else:
            out.append(tf.cast(g, dtype))
    return out


def wrap_allreduce(allreduce: Callable[[list], list], name: str) -> Callable[[list], list]:
    """`allreduce` (a list of gradients to the reduced list) with compression around it."""
    if check(name) == "none":
        return allreduce

    def compressed(grads):
        wire, restore = compress(grads, name)
        return decompress(allreduce(wire), restore)

    compressed.compression = name
    return compressed
