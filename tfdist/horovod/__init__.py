"""Horovod for Keras 3: optimizer wrapper, initial-state broadcast, callbacks.

Built on `horovod.tensorflow`'s core collectives (`allreduce`, `broadcast`),
which work on Keras 3, instead of `horovod.tensorflow.keras`, which does not
(horovod#4290, and averaging in a Keras 2 hook; see
`tfdist.compat.horovod_keras`). Modeled on Horovod's Keras API::

    from tfdist import horovod as thvd
    optimizer = thvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    model.compile(optimizer=optimizer, ...)
    model.fit(ds, callbacks=[thvd.BroadcastInitialState(0), thvd.MetricAverage()])

Nothing here imports Horovod until it is used; `runtime.require()` fails with
an install hint when it is missing.
"""

from tfdist.horovod.broadcast import broadcast_state, broadcast_variables
from tfdist.horovod.optimizer import DistributedOptimizer
from tfdist.horovod.runtime import INSTALL_HINT, is_available


def __getattr__(name):
    # Callbacks subclass keras.callbacks.Callback: import Keras only when asked.
    if name in ("BroadcastInitialState", "MetricAverage", "LearningRateWarmup",
                "warmup_learning_rate"):
        from tfdist.horovod import callbacks

        return getattr(callbacks, name)
    raise AttributeError(name)


__all__ = ["DistributedOptimizer", "broadcast_state", "broadcast_variables",
           "BroadcastInitialState", "MetricAverage", "LearningRateWarmup",
           "warmup_learning_rate", "INSTALL_HINT", "is_available"]
