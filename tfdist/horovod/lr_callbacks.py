"""Learning-rate callbacks for data-parallel training: warmup and epoch-range schedules.

* `LearningRateWarmup`: tfdist's `--warmup-epochs` ramp (Goyal et al. 2017)
  from the single-worker rate to `rate * size`, acting only during the warmup.
* `LearningRateScheduleCallback` and `LearningRateWarmupCallback`: Keras 3
  counterparts of Horovod's callbacks of the same names and arguments (the
  Horovod ones use Keras 2's `optimizer.lr` and backend and do not run on
  Keras 3). Each acts only inside its own epoch range, so they compose: a
  warmup for the first epochs, then one schedule per range after it.

None of them needs Horovod except for the size when it is not given.
"""

from __future__ import annotations

import keras


def warmup_learning_rate(initial_lr: float, size: int, warmup_epochs: float,
                         epoch: float) -> float:
    """Pure function: the learning rate at fractional `epoch` of a linear warmup.

    Goyal et al. 2017 ("Accurate, Large Minibatch SGD"): start at the
    single-worker rate and ramp linearly to `initial_lr * size` over the
    first `warmup_epochs`, then hold it.

    Args:
        initial_lr: The rate at epoch 0 (the single-worker rate).
        size: Number of ranks; the rate ends at `initial_lr * size`.
        warmup_epochs: Length of the ramp; 0 means no ramp.
        epoch: Epochs done so far, fractional (epoch + batch / steps).
    """
    if warmup_epochs <= 0 or epoch >= warmup_epochs:
        return initial_lr * size
    return initial_lr * (1.0 + (size - 1) * epoch / warmup_epochs)


def horovod_warmup_multiplier(size: int, warmup_epochs: float, steps_per_epoch: int,
                              epoch: float) -> float:
    """Pure function: Horovod's warmup multiplier of `initial_lr` at fractional `epoch`.

    Horovod's `LearningRateWarmupCallback` goes from `initial_lr / size` to
    `initial_lr`, shifted by one batch so that the last warmup batch is
    exactly `initial_lr`.
    """
    epoch += 1.0 / steps_per_epoch
    return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)


def _hvd_size() -> int:
    from tfdist.horovod import runtime

    return runtime.hvd().size()


def _steps_per_epoch(callback, given):
    steps = given or (callback.params or {}).get("steps")
    if not steps:
        raise ValueError(f"{type(callback).__name__} needs steps_per_epoch: pass it, or give "
                         "fit a dataset of known length or steps_per_epoch.")
    return steps


def _get_lr(optimizer) -> float:
    # A tensor first: NumPy 2 warns on np.array(keras.Variable) (its __array__ takes no copy).
    return float(keras.ops.convert_to_numpy(keras.ops.convert_to_tensor(optimizer.learning_rate)))


def _momentum_buffers(optimizer) -> list:
    """The velocity variables of an optimizer whose update is `v = m*v - lr*g` (SGD, RMSprop)."""
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    if not float(getattr(optimizer, "momentum", 0.0) or 0.0):
        return []
    return list(getattr(optimizer, "momentums", None) or
                getattr(optimizer, "_momentums", None) or [])


class LearningRateWarmup(keras.callbacks.Callback):
    """Ramps the learning rate from `initial_lr` to `initial_lr * size` (Goyal et al.).

    Updated at the start of every batch of the warmup from the fractional
    epoch; the batch that ends the warmup leaves `initial_lr * size` in the
    optimizer, and after it this callback never touches the rate again, so
    a later schedule (Keras's `LearningRateScheduler`,
    `LearningRateScheduleCallback`) owns it. A run resumed past the warmup
    is left alone.

    Args:
        initial_lr: The rate at the first step (the single-worker rate).
        warmup_epochs: Epochs the ramp lasts (may be fractional).
        size: Number of ranks; `hvd.size()` when None.
        steps_per_epoch: Batches per epoch; taken from `fit`'s params when None.
    """

    def __init__(self, initial_lr: float, warmup_epochs: float, size: int | None = None,
                 steps_per_epoch: int | None = None):
        super().__init__()
        if warmup_epochs < 0:
            raise ValueError(f"warmup_epochs must be >= 0. Received: warmup_epochs={warmup_epochs}.")
        self.initial_lr, self.warmup_epochs = initial_lr, warmup_epochs
        self.size, self.steps_per_epoch = size, steps_per_epoch
        self._epoch = 0
        self._ramping = False

    def on_train_begin(self, logs=None):
        if self.size is None:
            self.size = _hvd_size()
        self.steps_per_epoch = _steps_per_epoch(self, self.steps_per_epoch)
        self._ramping = False
        if self.warmup_epochs == 0:
            self.model.optimizer.learning_rate = self.initial_lr * self.size

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        epoch = self._epoch + batch / self.steps_per_epoch
        if epoch < self.warmup_epochs:
            self._ramping = True
            self.model.optimizer.learning_rate = warmup_learning_rate(
                self.initial_lr, self.size, self.warmup_epochs, epoch)

    def on_train_batch_end(self, batch, logs=None):
        if self._ramping and self._epoch + (batch + 1) / self.steps_per_epoch >= self.warmup_epochs:
            # Hand over at the end of the last warmup batch, before any
            # later schedule's epoch begin, so that the schedule wins.
            self._ramping = False
            self.model.optimizer.learning_rate = self.initial_lr * self.size


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the rate to `initial_lr * multiplier(epoch)` for epochs in [start_epoch, end_epoch).

    Horovod's `LearningRateScheduleCallback` for Keras 3, same arguments and
    values. Outside its epoch range it does nothing, so several compose (one
    per range, after a warmup).

    Args:
        initial_lr: The rate the multiplier scales (Horovod: the full,
            size-scaled rate).
        multiplier: A function of the (fractional) epoch, or a constant `c`,
            meaning `c ** (epoch - start_epoch)` (Horovod's exponential decay).
        start_epoch: First epoch the schedule acts in.
        end_epoch: First epoch it no longer acts in; None for never.
        staircase: True sets the rate once, at the first batch of each epoch,
            from the integer epoch; False at every batch, from the fractional
            epoch (`epoch + batch / steps_per_epoch`).
        momentum_correction: When the optimizer has momentum (SGD, RMSprop),
            scale its velocity by `new_lr / old_lr` whenever the rate changes
            (Goyal et al.). Horovod multiplies the momentum coefficient by the
            same ratio for one step; Keras 3 compiles the coefficient into the
            train step as a constant, and scaling the velocity is the same
            arithmetic (`m * (new/old) * v == m * ((new/old) * v)`).
        steps_per_epoch: Batches per epoch, for `staircase=False`; taken
            from `fit`'s params when None.

    Raises:
        ValueError: when `initial_lr` is None.
    """

    def __init__(self, initial_lr, multiplier, start_epoch: int = 0, end_epoch: int | None = None,
                 staircase: bool = True, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None):
        super().__init__()
        if initial_lr is None:
            raise ValueError("LearningRateScheduleCallback needs initial_lr. Received: "
                             "initial_lr=None.")
        self.initial_lr = initial_lr
        self.start_epoch, self.end_epoch = start_epoch, end_epoch
        self.staircase, self.momentum_correction = staircase, momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.multiplier = lambda epoch: multiplier ** (epoch - start_epoch)

    def on_train_begin(self, logs=None):
        if not self.staircase:
            self.steps_per_epoch = _steps_per_epoch(self, self.steps_per_epoch)

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def _in_range(self) -> bool:
        return self.current_epoch >= self.start_epoch and (
            self.end_epoch is None or self.current_epoch < self.end_epoch)

    def on_train_batch_begin(self, batch, logs=None):
        if not self._in_range():
            return
        if self.staircase and batch == 0:
            self._adjust(self.current_epoch)
        elif not self.staircase:
            self._adjust(self.current_epoch + batch / self.steps_per_epoch)

    def _adjust(self, epoch):
        optimizer = self.model.optimizer
        old = _get_lr(optimizer)
        new = self.initial_lr * self.multiplier(epoch)
        optimizer.learning_rate = new
        if self.momentum_correction and old and new != old:
            ratio = _get_lr(optimizer) / old
            for v in _momentum_buffers(optimizer):
                v.assign(v * ratio)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = _get_lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Horovod's `LearningRateWarmupCallback` for Keras 3: `initial_lr / size` to `initial_lr`.

    Over the first `warmup_epochs`, updated every batch (see
    `horovod_warmup_multiplier`); the last warmup batch runs at exactly
    `initial_lr`. Unlike `LearningRateWarmup`, `initial_lr` is the full,
    size-scaled rate, as in Horovod.

    Args:
        initial_lr: The rate at the end of the warmup.
        warmup_epochs: Epochs the ramp lasts.
        momentum_correction: As in `LearningRateScheduleCallback`.
        steps_per_epoch: Batches per epoch; taken from `fit`'s params when None.
        verbose: 1 prints a line on rank 0 when the warmup ends.
        size: Number of ranks; `hvd.size()` when None.
    """

    def __init__(self, initial_lr, warmup_epochs: int = 5, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None, verbose: int = 0, size: int | None = None):
        super().__init__(initial_lr, self._multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.warmup_epochs, self.verbose, self.size = warmup_epochs, verbose, size

    def _multiplier(self, epoch):
        return horovod_warmup_multiplier(self.size, self.warmup_epochs, self.steps_per_epoch,
                                         epoch)

    def on_train_begin(self, logs=None):
        if self.size is None:
            self.size = _hvd_size()
        super().on_train_begin(logs)

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0:
            from tfdist.horovod import runtime

            if runtime.hvd().rank() == 0:
                print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                      f"{_get_lr(self.model.optimizer):g}.")
