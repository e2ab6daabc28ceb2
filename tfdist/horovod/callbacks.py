"""Keras 3 callbacks for Horovod training: initial-state broadcast, metric averaging.

Thin wrappers: the implementation is shared with the shared-memory engine's
(`tfdist.collectives.keras_callbacks`), on `HorovodCollectives`. The
learning-rate callbacks are in `tfdist.horovod.lr_callbacks`.
"""

from __future__ import annotations

from tfdist.collectives import keras_callbacks
from tfdist.horovod.collectives import HorovodCollectives
from tfdist.horovod.lr_callbacks import LearningRateWarmup  # noqa: F401  (older import path)


class BroadcastInitialState(keras_callbacks.BroadcastInitialState):
    """Broadcasts model and optimizer variables from `root_rank` when training begins.

    `fit` builds the model and the optimizer before `on_train_begin`, so every
    variable exists by then; on a resumed run the state is whatever rank 0
    restored before calling `fit`.

    Args:
        root_rank: The rank whose state wins.
    """

    def __init__(self, root_rank: int = 0):
        super().__init__(HorovodCollectives, root_rank)
        self.root_rank = root_rank


class MetricAverage(keras_callbacks.MetricAverage):
    """Replaces each epoch-end metric by its average across ranks.

    Each rank's `fit` logs describe its own shard. This callback averages them
    in place, so History, later callbacks and the chief's metrics file see the
    global value (with equal shards, exactly the single-replica epoch metric).
    Keras runs user callbacks before its History callback, so History records
    the averaged values. Ranks that log different metrics all raise
    `CollectiveMismatchError`, naming them.
    """

    def __init__(self):
        super().__init__(HorovodCollectives)
