"""Building the optimizer a run asks for: name, schedule, clipping, accumulation.

Clipping (`--clipnorm`, by global norm) and accumulation (`--accumulate K`)
use Keras's own optimizer options; `tfdist.compat.keras_grad_reduction` makes
both act on the gradient *after* the cross-replica all-reduce, as on one device.
"""

from __future__ import annotations

import inspect

from tfdist import schedules
from tfdist.errors import ConfigError

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")


def check(cfg: dict) -> None:
    """Validates how optimizer options combine (each one's own range is
    `tfdist.config`'s); no TensorFlow needed.

    Raises:
        ConfigError: naming the bad value.
    """
    schedules.check(cfg["lr_schedule"], cfg["warmup_steps"])


def optimizer_classes() -> dict:
    """Every optimizer class in `keras.optimizers`, by lower-case name (lamb included,
    which `keras.optimizers.get` does not resolve)."""
    import keras

    return {name.lower(): obj for name, obj in vars(keras.optimizers).items()
            if isinstance(obj, type) and issubclass(obj, keras.optimizers.Optimizer)
            and obj is not keras.optimizers.Optimizer and name != "LossScaleOptimizer"}


def build_optimizer(cfg: dict, learning_rate: float):
    """A Keras optimizer for `cfg` (call inside the strategy scope).

    Raises:
        ConfigError: for an optimizer name Keras does not know.
    """
    cls = optimizer_classes().get(cfg["optimizer"].lower())
    if cls is None:
        raise ConfigError(f"Unknown optimizer {cfg['optimizer']!r}. Valid: "
                          f"{sorted(optimizer_classes())}.")
    kwargs = {"learning_rate": schedules.make_schedule(learning_rate, cfg["warmup_steps"],
                                                       cfg["lr_schedule"])}
    if "momentum" in inspect.signature(cls).parameters:
        kwargs["momentum"] = cfg["momentum"]
    if cfg["clipnorm"] > 0:
        kwargs["global_clipnorm"] = cfg["clipnorm"]
    if cfg["accumulate"] > 1:
        kwargs["gradient_accumulation_steps"] = cfg["accumulate"]
    return cls(**kwargs)
