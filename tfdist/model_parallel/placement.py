"""Layers on explicit devices: checking devices, placed copies of a model, the table."""

from __future__ import annotations

from tfdist import parameters
from tfdist.compat.tf_device_scope import place_layer
from tfdist.errors import ConfigError


def short_name(device: str) -> str:
    """'/job:localhost/replica:0/task:0/device:CPU:1' or '/cpu:1' -> 'CPU:1'.

    A device of another process keeps its task: '/job:worker/replica:0/task:1/device:CPU:0'
    -> 'task:1/CPU:0' (pipeline stages across processes).
    """
    import tensorflow as tf

    spec = tf.DeviceSpec.from_string(device)
    if spec.device_type is None:
        return device
    local = f"{spec.device_type.upper()}:{spec.device_index or 0}"
    if spec.job in (None, "localhost"):
        return local
    return f"task:{spec.task or 0}/{local}"


def check_devices(devices: list[str]) -> list[str]:
    """Returns `devices` unchanged if each names an existing logical device.

    Raises:
        ConfigError: naming the missing device and the ones that exist.
    """
    import tensorflow as tf

    existing = {short_name(d.name) for d in tf.config.list_logical_devices()}
    for device in devices:
        try:
            name = short_name(device)
        except ValueError:
            name = None
        if name not in existing:
            raise ConfigError(
                f"Device {device!r} does not exist. Logical devices here: {sorted(existing)}. "
                f"Name one of them, or pass --devices N to split the CPU into N logical devices.")
    return devices


def check_regularizers(model) -> None:
    """ConfigError naming a layer with a regularizer (the stage-wise backward drops model losses)."""
    for layer in model.layers:
        if any(getattr(layer, a, None) is not None
               for a in ("kernel_regularizer", "bias_regularizer", "activity_regularizer")):
            raise ConfigError(f"Layer {layer.name!r} has a regularizer; tfdist's stage-wise "
                              f"backward pass does not carry model losses. Remove it, or use a "
                              "data-parallel strategy.")


def placed_copy(layer, device: str):
    """A fresh, unbuilt copy of `layer` from its config, placed on `device`.

    Raises:
        ConfigError: naming a layer that cannot be copied from its config, or
            that makes its weights when constructed.
    """
    try:
        copy = layer.__class__.from_config(layer.get_config())
    except Exception as e:  # any failure of a user's layer class: one line naming it
        raise ConfigError(
            f"Layer {layer.name!r} ({type(layer).__name__}) cannot be copied onto {device} from "
            f"its config: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}. Give "
            "the layer a get_config() that its constructor accepts (Keras serialization), or "
            "train it with a data-parallel strategy.") from None
    if copy.built and copy.weights:
        raise ConfigError(f"Layer {layer.name!r} ({type(layer).__name__}) creates its weights "
                          f"when constructed, so they cannot be placed on {device}. Create them "
                          "in build() (Keras's convention), or use a data-parallel strategy.")
    return place_layer(copy, device)


def variable_device(variable) -> str:
    """The device a Keras variable's storage lives on."""
    return getattr(variable, "value", variable).device


def placement_rows(layers) -> list[tuple[str, str, int, int]]:
    """(layer, device, parameters, bytes) per layer and device, read from its variables.

    A tensor-parallel layer has a row per device holding its shards (in the
    order its variables were made), so the per-device totals count each
    shard where it lives; a layer without weights has one row, its placed
    device or "-".
    """
    import numpy as np

    rows = []
    for layer in layers:
        per_device: dict[str, list[int]] = {}
        for v in layer.weights:
            size = parameters.count([v])
            entry = per_device.setdefault(short_name(variable_device(v)), [0, 0])
            entry[0] += size
            entry[1] += size * np.dtype(v.dtype).itemsize
        if not per_device:
            placed = getattr(layer, "_tfdist_device", None)
            rows.append((layer.name, short_name(placed) if placed else "-", 0, 0))
        rows.extend((layer.name, device, params, nbytes)
                    for device, (params, nbytes) in per_device.items())
    return rows
