"""Horovod's learning-rate schedule test, shared by the unit test and the 2-rank worker.

From horovod test/parallel/test_tensorflow2_keras.py, `test_train_model_lr_schedule`:
a 5-epoch warmup to `initial_lr`, then `initial_lr` times 0.1 ** (epoch - 5)
for epochs 5-9, 0.01 ** (epoch - 10) for 10-14, and `epoch` for 15-19 (a
constant multiplier is exponential decay in Horovod 0.28.1), 5 steps per
epoch. No pytest here: the Horovod venv runs it too.
"""

import keras
import numpy as np

from tfdist.horovod.lr_callbacks import (LearningRateScheduleCallback,
                                         LearningRateWarmupCallback, horovod_warmup_multiplier)

STEPS, EPOCHS = 5, 20


class RecordLR(keras.callbacks.Callback):
    """The optimizer's rate at every batch begin and at every epoch end."""

    def __init__(self):
        super().__init__()
        self.batches, self.epochs = [], []

    def _lr(self):
        return float(keras.ops.convert_to_numpy(
            keras.ops.convert_to_tensor(self.model.optimizer.learning_rate)))

    def on_train_batch_begin(self, batch, logs=None):
        self.batches.append(self._lr())

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(self._lr())


def horovod_model(optimizer):
    """Horovod's test model (ThresholdedReLU(0.5) is Keras 3's ReLU(threshold=0.5))."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2),
                              keras.layers.RepeatVector(3), keras.layers.ReLU(threshold=0.5)])
    model.compile(loss="mse", optimizer=optimizer, metrics=["categorical_accuracy"])
    return model


def horovod_schedule(initial_lr, size=None):
    """Horovod's callbacks, in its order (size None: hvd.size())."""
    return [LearningRateWarmupCallback(initial_lr=initial_lr, warmup_epochs=5, size=size),
            LearningRateScheduleCallback(initial_lr=initial_lr, multiplier=1e-1,
                                         start_epoch=5, end_epoch=10),
            LearningRateScheduleCallback(initial_lr=initial_lr, multiplier=1e-2,
                                         start_epoch=10, end_epoch=15),
            LearningRateScheduleCallback(initial_lr=initial_lr, multiplier=lambda epoch: epoch,
                                         start_epoch=15, end_epoch=20)]


def expected_epoch_end_lrs(initial_lr, size):
    """The rate at each epoch end under `horovod_schedule`, from Horovod's formulas."""
    out = []
    for e in range(EPOCHS):
        if e < 5:  # last batch of a warmup epoch: fractional epoch e + (STEPS-1)/STEPS
            out.append(initial_lr * horovod_warmup_multiplier(size, 5, STEPS,
                                                              e + (STEPS - 1) / STEPS))
        elif e < 10:
            out.append(initial_lr * 0.1 ** (e - 5))
        elif e < 15:
            out.append(initial_lr * 0.01 ** (e - 10))
        else:
            out.append(initial_lr * e)
    return out


def horovod_assertions(lrs, initial_lr):
    """Horovod's own `StoreLearningRateCallback` checks, epoch by epoch."""
    assert len(lrs) == EPOCHS
    for epoch, lr in enumerate(lrs):
        if 0 <= epoch < 5:
            assert lr <= initial_lr or np.isclose(lr, initial_lr), (epoch, lr)
        if 5 < epoch < 10:
            assert lr <= initial_lr * 1e-1 or np.isclose(lr, initial_lr * 1e-1), (epoch, lr)
        if 10 < epoch < 15:
            assert lr < initial_lr * 1e-2 or np.isclose(lr, initial_lr * 1e-2), (epoch, lr)
        if 15 <= epoch < 20:
            assert np.isclose(lr, initial_lr * epoch), (epoch, lr)


def fit_horovod_schedule(model, x, y, initial_lr, size=None, callbacks=()):
    """Horovod's fit: 20 epochs of 5 steps (10 examples, batch 2); returns (record, history)."""
    record = RecordLR()
    history = model.fit(x, y, batch_size=2, steps_per_epoch=STEPS, epochs=EPOCHS, verbose=0,
                        callbacks=[*callbacks, *horovod_schedule(initial_lr, size), record])
    return record, history
