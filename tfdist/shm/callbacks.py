"""Keras callbacks for the shared-memory engine: initial-state broadcast, metric averaging."""

from __future__ import annotations

import keras
import numpy as np

from tfdist.allreduce_optimizer import state_variables
from tfdist.shm import runtime


def broadcast_state(model, optimizer=None, root: int = 0) -> None:
    """Sets the model's and optimizer's variables to rank `root`'s values.

    Builds the optimizer on the trainable variables first when needed, so its
    slots exist (and are broadcast) on every rank.
    """
    variables = state_variables(model, optimizer)
    values = runtime.communicator().broadcast(
        [np.asarray(keras.ops.convert_to_numpy(v.value)) for v in variables], root)
    for variable, value in zip(variables, values):
        variable.assign(value)


class BroadcastInitialState(keras.callbacks.Callback):
    """Broadcasts model and optimizer variables from `root` when `fit` begins.

    Args:
        root: The rank whose state wins (the chief, which restored any backup).
    """

    def __init__(self, root: int = 0):
        super().__init__()
        self.root = root

    def on_train_begin(self, logs=None):
        broadcast_state(self.model, self.model.optimizer, self.root)


class MetricAverage(keras.callbacks.Callback):
    """Replaces each epoch-end metric by its mean across ranks (before History records it)."""

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        names = [n for n in sorted(logs)  # sorted: the same order on every rank
                 if isinstance(logs[n], (int, float)) or getattr(logs[n], "shape", None) == ()]
        if not names:
            return
        (mean,) = runtime.communicator().allreduce(
            [np.array([float(logs[n]) for n in names], np.float64)], average=True)
        for name, value in zip(names, mean):
            logs[name] = float(value)
