"""Learning-rate warmup and decay for large global batches.

`lr_at` is the pure formula (tested without TensorFlow); `WarmupSchedule` is
the same formula as a serializable Keras LearningRateSchedule.

* warmup: linear from `base_lr / warmup_steps` to `base_lr` over the first
  `warmup_steps` optimizer steps (Goyal et al. 2017: large-batch SGD needs it);
* decay "constant": stay at `base_lr`;
* decay "inverse_sqrt" (the Noam / Transformer schedule, Vaswani et al. 2017):
  `base_lr * sqrt(warmup_steps / step)` after the warmup, so the peak is
  `base_lr` and the curve is continuous at the end of the warmup.
"""

from __future__ import annotations

import math

from tfdist.errors import ConfigError

DECAYS = ("constant", "inverse_sqrt", "noam")


def check(decay: str, warmup_steps: int) -> None:
    """Validates a schedule's settings (no TensorFlow needed).

    Raises:
        ConfigError: for an unknown decay or a negative warmup, or
            inverse_sqrt without warmup.
    """
    if decay not in DECAYS:
        raise ConfigError(f"Unknown lr schedule {decay!r}; valid: {list(DECAYS)}.")
    if warmup_steps < 0:
        raise ConfigError(f"warmup_steps must be >= 0. Received: {warmup_steps}.")
    if decay in ("inverse_sqrt", "noam") and warmup_steps == 0:
        raise ConfigError(f"lr schedule {decay!r} needs --warmup-steps > 0 (it sets where the "
                          "peak is). Received: warmup_steps=0.")


def lr_at(step: int, base_lr: float, warmup_steps: int = 0, decay: str = "constant") -> float:
    """Learning rate for 0-based optimizer step `step`."""
    s = step + 1
    if warmup_steps and s <= warmup_steps:
        return base_lr * s / warmup_steps
    if decay in ("inverse_sqrt", "noam"):
        return base_lr * math.sqrt(warmup_steps / s)
    return base_lr


def make_schedule(base_lr: float, warmup_steps: int, decay: str):
    """The Keras schedule, or the plain float when there is nothing to schedule."""
    check(decay, warmup_steps)
    if not warmup_steps and decay == "constant":
        return base_lr
    return _schedule_class()(base_lr, warmup_steps, decay)


_CLASS = []


def _schedule_class():
    if _CLASS:
        return _CLASS[0]
    import keras
    from keras import ops

    @keras.saving.register_keras_serializable(package="tfdist")
    class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
        """`lr_at` as a Keras schedule."""

        def __init__(self, base_lr, warmup_steps, decay="constant"):
            self.base_lr, self.warmup_steps, self.decay = base_lr, warmup_steps, decay

        def __call__(self, step):
            s = ops.cast(step, "float32") + 1.0
            lr = ops.convert_to_tensor(self.base_lr, "float32")
            if self.decay in ("inverse_sqrt", "noam"):
                after = lr * ops.sqrt(float(self.warmup_steps) / s)
            else:
                after = lr
            if not self.warmup_steps:
                return after
            warm = lr * s / float(self.warmup_steps)
            return ops.where(s <= self.warmup_steps, warm, after)

        def get_config(self):
            return {"base_lr": self.base_lr, "warmup_steps": self.warmup_steps,
                    "decay": self.decay}

    _CLASS.append(WarmupSchedule)
    return WarmupSchedule
