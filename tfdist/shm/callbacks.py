"""Keras callbacks for the shared-memory engine: initial-state broadcast, metric averaging.

Thin wrappers: the implementation is shared with Horovod's
(`tfdist.collectives.keras_callbacks`), on the engine's `ShmCollectives`.
"""

from __future__ import annotations

from tfdist.collectives import keras_callbacks
from tfdist.shm.collectives import ShmCollectives


def broadcast_state(model, optimizer=None, root: int = 0) -> None:
    """Sets the model's and optimizer's variables to rank `root`'s values.

    Builds the optimizer on the trainable variables first when needed, so its
    slots exist (and are broadcast) on every rank.
    """
    keras_callbacks.broadcast_state(model, optimizer, ShmCollectives(), root)


class BroadcastInitialState(keras_callbacks.BroadcastInitialState):
    """Broadcasts model and optimizer variables from `root` when `fit` begins.

    Args:
        root: The rank whose state wins (the chief, which restored any backup).
    """

    def __init__(self, root: int = 0):
        super().__init__(ShmCollectives, root)
        self.root = root


class MetricAverage(keras_callbacks.MetricAverage):
    """Replaces each epoch-end metric by its mean across ranks (before History records it).

    Raises `CollectiveMismatchError` on every rank when the ranks log different metrics.
    """

    def __init__(self):
        super().__init__(ShmCollectives)
