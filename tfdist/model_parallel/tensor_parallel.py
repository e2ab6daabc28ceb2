"""Tensor parallelism (Megatron-LM style): Dense layers and attention heads split across devices.

The layers live in `tp_layers` (`ColumnParallelDense`, `RowParallelDense`,
`ParallelMLP`, and their base `TensorParallelLayer`) and `tp_attention`
(`HeadParallelAttention`); what they do across devices is named in `tp_ops`.
Those modules import TensorFlow, so this one reaches them lazily: its names
(`tensor_parallel.ColumnParallelDense`, `layer_classes()`) resolve on first
use, and `is_tensor_parallel` and the optimizer check need no TensorFlow.
Whole models are split into these layers and gathered back by
`tfdist.model_parallel.surgery`.
"""

from __future__ import annotations

LAYER_NAMES = ("ColumnParallelDense", "RowParallelDense", "ParallelMLP", "HeadParallelAttention")


def layer_classes() -> dict:
    """name -> class of the tensor-parallel layers (for `from_layer` and isinstance)."""
    from tfdist.model_parallel import tp_attention, tp_layers

    return {name: getattr(tp_attention if name == "HeadParallelAttention" else tp_layers, name)
            for name in LAYER_NAMES}


def __getattr__(name):
    """The layer classes by name, imported on first use (`tensor_parallel.ParallelMLP`)."""
    if name in LAYER_NAMES:
        return layer_classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_tensor_parallel(layer) -> bool:
    """Whether `layer` is a tensor-parallel replacement of a plain layer (it has `to_plain`)."""
    return bool(getattr(layer, "_tfdist_tensor_parallel", False))




def check_optimizer(optimizer, layers) -> None:
    """Refuses an optimizer that would step tensor-parallel shards unlike their whole weight.

    Keras optimizers update each variable alone, and a tensor-parallel layer
    holds each plain weight as shards, one variable per device. An
    elementwise update (SGD, Adam, RMSprop, Lion, ...) and `global_clipnorm`
    (one norm over every variable) take the same step on the shards as on
    the weight. Per-variable `clipnorm` and `tfdist.optim.WHOLE_WEIGHT_OPTIMIZERS` do
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
    from tfdist.optim import whole_weight_optimizer

    if whole_weight_optimizer(inner) is not None:
        raise ConfigError(
            f"{type(inner).__name__} scales each variable's step by statistics of the "
            f"whole variable, but {where} hold each weight as shards, so each shard "
            "would take its own step, unlike one device. Use an elementwise optimizer "
            "(adam, adamw, sgd, rmsprop, lion, ...) or no tensor parallelism.")
