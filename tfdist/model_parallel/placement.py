"""Layers on explicit devices: checking devices, assigning layers, placed copies, the table."""

from __future__ import annotations

from tfdist.compat.tf_device_scope import place_layer
from tfdist.errors import ConfigError
from tfdist.model_parallel import plan


def short_name(device: str) -> str:
    """'/job:localhost/replica:0/task:0/device:CPU:1' or '/cpu:1' -> 'CPU:1'."""
    import tensorflow as tf

    spec = tf.DeviceSpec.from_string(device)
    if spec.device_type is None:
        return device
    return f"{spec.device_type.upper()}:{spec.device_index or 0}"


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


def chain_layers(model) -> list:
    """The layers of a model that is a single chain (each layer feeds only the next).

    Raises:
        ConfigError: for a model with branches, several inputs or shared layers.
    """
    import keras

    layers = [l for l in model.layers if not isinstance(l, keras.layers.InputLayer)]
    if isinstance(model, keras.Sequential):
        return layers
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise ConfigError(f"Splitting into stages needs one input and one output. Received model "
                          f"{model.name!r} with {len(model.inputs)} inputs and "
                          f"{len(model.outputs)} outputs.")
    previous = model.inputs[0]
    for layer in layers:
        nodes = layer._inbound_nodes
        if len(nodes) != 1 or len(nodes[0].input_tensors) != 1 or \
                nodes[0].input_tensors[0] is not previous:
            raise ConfigError(f"Splitting into stages needs a chain of layers, each feeding the "
                              f"next. Layer {layer.name!r} of model {model.name!r} does not take "
                              f"exactly the previous layer's output.")
        previous = nodes[0].output_tensors[0]
    return layers


def assign(layer_names: list[str], devices: list[str] | None = None,
           placement: str = "") -> list[tuple[str, list[str]]]:
    """Groups of (device, layer names) from a --placement spec or an even split over devices.

    Raises:
        ConfigError: for a bad spec or too few layers.
    """
    if placement:
        groups = plan.parse_placement(placement)
        plan.check_groups_cover(groups, layer_names)
        return groups
    if not devices:
        raise ConfigError("Model parallelism needs devices: pass --devices N (at least 2) or "
                          "--placement 'layer_a=/cpu:0;layer_b=/cpu:1'.")
    sizes = plan.even_split(len(layer_names), len(devices))
    groups, start = [], 0
    for device, size in zip(devices, sizes):
        groups.append((device, layer_names[start:start + size]))
        start += size
    return groups


def placed_stages(model, groups: list[tuple[str, list[str]]]) -> list[tuple[str, list]]:
    """Fresh copies of a chain model's layers, built on their devices, with its weights.

    Copies come from each layer's config, are placed with `place_layer` (variables
    and compute), built by calling them on the model's input spec, and given the
    original's weights, so a split model starts exactly where the unsplit one does.

    Returns:
        [(device, [placed layers])] in stage order.
    """
    import keras

    check_devices([d for d, _ in groups])
    originals = {l.name: l for l in chain_layers(model)}
    for layer in originals.values():
        if any(getattr(layer, a, None) is not None
               for a in ("kernel_regularizer", "bias_regularizer", "activity_regularizer")):
            raise ConfigError(f"Layer {layer.name!r} has a regularizer; tfdist's stage-wise "
                              f"backward pass does not carry model losses. Remove it.")
    h = keras.Input(shape=model.inputs[0].shape[1:], dtype=model.inputs[0].dtype)
    stages = []
    for device, names in groups:
        placed = []
        for name in names:
            old = originals[name]
            new = place_layer(old.__class__.from_config(old.get_config()), device)
            h = new(h)
            new.set_weights(old.get_weights())
            placed.append(new)
        stages.append((device, placed))
    return stages


def variable_device(variable) -> str:
    """The device a Keras variable's storage lives on."""
    return getattr(variable, "value", variable).device


def placement_rows(layers) -> list[tuple[str, str, int, int]]:
    """(layer, device, parameters, bytes) per layer, the device read from its variables."""
    import numpy as np

    rows = []
    for layer in layers:
        devices = sorted({short_name(variable_device(v)) for v in layer.weights})
        placed = getattr(layer, "_tfdist_device", None)
        device = ",".join(devices) if devices else (short_name(placed) if placed else "-")
        params = sum(int(np.prod(v.shape)) for v in layer.weights)
        nbytes = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in layer.weights)
        rows.append((layer.name, device, params, nbytes))
    return rows
