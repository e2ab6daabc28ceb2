"""Building the optimizer a run asks for: name, schedule, clipping, accumulation.

Clipping (`--clipnorm`, by global norm) and accumulation (`--accumulate K`)
use Keras's own optimizer options; `tfdist.compat.keras_grad_reduction` makes
both act on the gradient *after* the cross-replica all-reduce, as on one device.
"""

from __future__ import annotations

import inspect

from tfdist import lr_schedules
from tfdist.errors import ConfigError

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")

# Optimizers whose step for a variable reads the whole variable, not each element alone:
# LAMB's trust ratio ||w|| / ||update||; Adafactor's step scaled by the RMS of the weight
# and of the update, and its second moment factored into the means of rows and columns;
# Muon's orthogonalised matrix. On a part of a weight (a tensor-parallel shard, a ZeRO
# owner's part) they would compute these over the part. Keras class names; the one list
# tensor parallelism and optimizer-state sharding refuse.
WHOLE_WEIGHT_OPTIMIZERS = ("Lamb", "Adafactor", "Muon")


def reads_whole_weights(name: str) -> bool:
    """Whether optimizer `name` (class or option name, any case) is a whole-weight one."""
    return name.lower() in {n.lower() for n in WHOLE_WEIGHT_OPTIMIZERS}


def whole_weight_optimizer(optimizer):
    """The optimizer instance (a LossScaleOptimizer's inner one) when it is one of
    `WHOLE_WEIGHT_OPTIMIZERS` (or a subclass), else None."""
    import keras

    inner = getattr(optimizer, "inner_optimizer", optimizer)
    for name in WHOLE_WEIGHT_OPTIMIZERS:
        cls = getattr(keras.optimizers, name, None)
        if cls is not None and isinstance(inner, cls):
            return inner
    return None


def check(options) -> None:
    """Validates how optimizer options combine (each one's own range is
    `tfdist.config`'s); no TensorFlow needed.

    Args:
        options: The run's `tfdist.settings.Optimization`.

    Raises:
        ConfigError: naming the bad value.
    """
    lr_schedules.check(options.lr_schedule, options.warmup_steps)


def optimizer_classes() -> dict:
    """Every optimizer class in `keras.optimizers`, by lower-case name (lamb included,
    which `keras.optimizers.get` does not resolve)."""
    import keras

    return {name.lower(): obj for name, obj in vars(keras.optimizers).items()
            if isinstance(obj, type) and issubclass(obj, keras.optimizers.Optimizer)
            and obj is not keras.optimizers.Optimizer and name != "LossScaleOptimizer"}


def build_optimizer(options, learning_rate: float):
    """The Keras optimizer the options ask for (call inside the strategy scope).

    Args:
        options: The run's `tfdist.settings.Optimization` (`Settings.of(cfg).optimization`).
        learning_rate: After --lr-scaling; the schedule starts from it.

    Raises:
        ConfigError: for an optimizer name Keras does not know.
    """
    cls = optimizer_classes().get(options.optimizer.lower())
    if cls is None:
        raise ConfigError(f"Unknown optimizer {options.optimizer!r}. Valid: "
                          f"{sorted(optimizer_classes())}.")
    kwargs = {"learning_rate": lr_schedules.make_schedule(learning_rate, options.warmup_steps,
                                                       options.lr_schedule)}
    if "momentum" in inspect.signature(cls).parameters:
        kwargs["momentum"] = options.momentum
    if options.clipnorm > 0:
        kwargs["global_clipnorm"] = options.clipnorm
    if options.accumulate > 1:
        kwargs["gradient_accumulation_steps"] = options.accumulate
    return cls(**kwargs)
