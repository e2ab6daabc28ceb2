"""Keras 3 callbacks for Horovod training: broadcast, metric averaging, LR warmup."""

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


class BroadcastInitialState(keras.callbacks.Callback):
    """Broadcasts model and optimizer variables from `root_rank` when training begins.

    `fit` builds the model and the optimizer before `on_train_begin`, so every
    variable exists by then; on a resumed run the state is whatever rank 0
    restored before calling `fit`.

    Args:
        root_rank: The rank whose state wins.
    """

    def __init__(self, root_rank: int = 0):
        super().__init__()
        self.root_rank = root_rank

    def on_train_begin(self, logs=None):
        from tfdist.horovod.broadcast import broadcast_state

        broadcast_state(self.model, self.model.optimizer, self.root_rank)


class MetricAverage(keras.callbacks.Callback):
    """Replaces each epoch-end metric by its average across ranks.

    Each rank's `fit` logs describe its own shard. This callback averages them
    in place, so History, later callbacks and the chief's metrics file see the
    global value (with equal shards, exactly the single-replica epoch metric).
    Keras runs user callbacks before its History callback, so History records
    the averaged values.
    """

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        import tensorflow as tf

        from tfdist.horovod import runtime

        hvd = runtime.hvd()
        # Sorted names: every rank issues the same allreduces in the same order.
        for name in sorted(logs):
            value = logs[name]
            if isinstance(value, (int, float)) or getattr(value, "shape", None) == ():
                logs[name] = float(hvd.allreduce(tf.constant(float(value), tf.float64),
                                                 op=hvd.Average, name=f"tfdist_metric_{name}"))


class LearningRateWarmup(keras.callbacks.Callback):
    """Ramps the learning rate from `initial_lr` to `initial_lr * size` (Goyal et al.).

    Updated at the start of every batch from the fractional epoch, as in
    Horovod's `LearningRateWarmupCallback`.

    Args:
        initial_lr: The rate at the first step (the single-worker rate).
        warmup_epochs: Epochs the ramp lasts.
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

    def on_train_begin(self, logs=None):
        if self.size is None:
            from tfdist.horovod import runtime

            self.size = runtime.hvd().size()
        if self.steps_per_epoch is None:
            self.steps_per_epoch = (self.params or {}).get("steps")
        if not self.steps_per_epoch:
            raise ValueError("LearningRateWarmup needs steps_per_epoch: pass it, or give fit "
                             "a dataset of known length or steps_per_epoch.")

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        epoch = self._epoch + batch / self.steps_per_epoch
        self.model.optimizer.learning_rate = warmup_learning_rate(
            self.initial_lr, self.size, self.warmup_epochs, epoch)
