"""Keras 3 callbacks for Horovod training: initial-state broadcast, metric averaging.

The learning-rate callbacks are in `tfdist.horovod.lr_callbacks`.
"""

from __future__ import annotations

import keras

from tfdist.horovod.lr_callbacks import LearningRateWarmup  # noqa: F401  (older import path)


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
                                                 op=hvd.Average, name=f"tfdist_metric_{name}",
                                                 ignore_name_scope=True))
