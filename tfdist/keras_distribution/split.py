"""A `keras.distribution.ModelParallel` on TensorFlow: the model's tensor-parallel copy.

When a model first trains, evaluates or predicts under a ModelParallel whose
model axis has several devices, `for_model` reads each weight's layout
(`layouts.plan`), refuses what cannot be honoured, and makes a copy of the
model whose split Dense layers are tfdist's column- and row-parallel layers
over the model axis's devices (`tfdist.model_parallel.surgery`), compiled as
the model is. The model's weights go into the copy before each call, and
after `fit` the gathered weights come back, so the model the user holds is
the one that trained. The copy keeps the optimizer's state between calls
(the model's own optimizer is not stepped).
"""

from __future__ import annotations

import weakref


from tfdist.errors import ConfigError
from tfdist.keras_distribution import backend, engine, layouts

# model -> (distribution, its tensor-parallel copy): kept beside the model, not on it.
_COPIES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# copy -> the compile config it was compiled with (the model's, when it last ran).
_COMPILED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def weights_of(model, distribution) -> list[layouts.Weight]:
    """Every variable of `model`'s layers with the layout `distribution` gives it."""
    out = []
    for layer in model.layers:
        for v in layer.weights:
            layout = distribution.get_variable_layout(v)
            axes = tuple(layout.axes) if layout is not None else None
            out.append(layouts.Weight(v.path, tuple(int(d) for d in v.shape), layer.name,
                                      type(layer).__name__, axes))
    return out


def describe(weights, splits, devices) -> str:
    """Where each split weight's parts live, for the chief's line."""
    from tfdist.model_parallel.plan import shard_bounds

    roles = {s.layer: s.role for s in splits}
    parts = []
    for w in weights:
        role = roles.get(w.layer)
        if role is None or (w.path.endswith("/bias") and role == "row"):
            continue
        dim = 0 if (role == "row" or w.path.endswith("/bias")) else 1
        bounds = shard_bounds(w.shape[dim], len(devices))
        where = ", ".join(f"{d} [{a}:{b}]" for d, (a, b) in zip(devices, bounds))
        parts.append(f"{w.path} {w.shape} split on axis {dim}: {where}")
    return "; ".join(parts)


def for_model(model, distribution):
    """The tensor-parallel copy of `model` for `distribution`, made once (ConfigError if refused)."""
    held = _COPIES.get(model)
    if held is not None and held[0] is distribution:
        return held[1]
    import keras

    from tfdist.model_parallel import placement, surgery

    from keras.src.models.functional import Functional

    if not isinstance(model, (Functional, keras.Sequential)):
        raise ConfigError(
            f"ModelParallel on TensorFlow splits functional and Sequential models; "
            f"{type(model).__name__} {model.name!r} is subclassed. Build it with keras.Model("
            "inputs, outputs), or use DataParallel.")
    weights = weights_of(model, distribution)
    axis, _ = engine.model_axis(distribution)
    splits = layouts.plan(weights, engine.mesh_sizes(distribution),
                          distribution.batch_dim_name, processes=1)  # one copy per process
    devices = engine.axis_devices(distribution, axis)
    roles = {s.layer: s.role for s in splits}

    def copy(layer):
        if isinstance(layer, keras.layers.InputLayer):
            return layer.__class__.from_config(layer.get_config())
        if layer.name in roles:
            return surgery.parallel_copy(layer, devices, roles[layer.name])
        return placement.placed_copy(layer, devices[0])

    clone = keras.models.clone_model(model, clone_function=copy)
    surgery.copy_weights(model, clone)
    copies = backend.num_processes()
    over = ("" if copies == 1 else
            f", {copies} copies across processes (shm)")
    engine.say(f"keras.distribution.ModelParallel -> tensor parallel over {axis!r} "
               f"({len(devices)} devices){over}, num_replicas={copies}, processes={copies}: "
               + (describe(weights, splits, devices) or "no weight split"))
    _COPIES[model] = (distribution, clone)
    return clone


def compile_like(clone, config) -> None:
    """Compiles `clone` as the model is (`config`), its optimizer all-reducing across
    processes when copies train together (the engine's wrapper)."""
    from keras.src.saving import serialization_lib

    from tfdist.model_parallel import tensor_parallel

    kwargs = serialization_lib.deserialize_keras_object(config)
    dist = backend.distributed()
    if dist is not None:
        kwargs["optimizer"] = dist.optimizer(kwargs["optimizer"])
        kwargs.update(dist.compile_kwargs())
    clone.compile(**kwargs)
    tensor_parallel.check_optimizer(clone.optimizer, clone.layers)


def run(model, method: str, original, args, kwargs):
    """`model.<method>(*args, **kwargs)` on its tensor-parallel copy (`fit` brings the weights back)."""
    from tfdist.model_parallel import surgery

    if not model.compiled and method != "predict":
        return original(model, *args, **kwargs)  # Keras's own error for an uncompiled model
    clone = for_model(model, engine.current())
    config = model.get_compile_config() if model.compiled else None
    if config is not None and _COMPILED.get(clone) != config:
        compile_like(clone, config)
        _COMPILED[clone] = config
    surgery.copy_weights(model, clone)
    dist = backend.distributed()
    if dist is not None and method == "fit":  # rank 0's start, metrics averaged
        kwargs = {**kwargs, "callbacks": [*dist.callbacks(), *(kwargs.get("callbacks") or [])]}
    out = original(clone, *args, **kwargs)  # the copy runs as a plain Keras model
    if method == "fit":
        surgery.copy_weights(clone, model)
    return out
