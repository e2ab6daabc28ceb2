"""Horovod for Keras 3: optimizer wrapper, initial-state broadcast, callbacks.

Built on `horovod.tensorflow`'s core collectives (`allreduce`, `broadcast`),
which work on Keras 3, instead of `horovod.tensorflow.keras`, which does not
(horovod#4290, and averaging in a Keras 2 hook; see
`tfdist.compat.horovod_keras`). Modeled on Horovod's Keras API::

    from tfdist import horovod as thvd
    optimizer = thvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    model.compile(optimizer=optimizer, ...)
    model.fit(ds, callbacks=[thvd.BroadcastInitialState(0), thvd.MetricAverage()])
    model = thvd.load_model("model.keras")   # the optimizer comes back distributed

Learning-rate callbacks (`LearningRateWarmup`, and Horovod's
`LearningRateWarmupCallback` / `LearningRateScheduleCallback` for Keras 3)
are in `tfdist.horovod.lr_callbacks`.

Nothing here imports Horovod until it is used; `runtime.require()` fails with
an install hint when it is missing.
"""

from tfdist.horovod.broadcast import broadcast_state, broadcast_variables
from tfdist.horovod.optimizer import DistributedOptimizer, distributed_class
from tfdist.horovod.runtime import INSTALL_HINT, is_available


from tfdist.horovod.saving import load_model

_CALLBACKS = ("BroadcastInitialState", "MetricAverage")
_LR = ("LearningRateWarmup", "LearningRateWarmupCallback", "LearningRateScheduleCallback",
       "warmup_learning_rate")


def __getattr__(name):
    # Callbacks subclass keras.callbacks.Callback: import Keras only when asked.
    if name in _CALLBACKS:
        from tfdist.horovod import callbacks

        return getattr(callbacks, name)
    if name in _LR:
        from tfdist.horovod import lr_callbacks

        return getattr(lr_callbacks, name)
    raise AttributeError(name)


__all__ = ["DistributedOptimizer", "distributed_class", "load_model",
           "broadcast_state", "broadcast_variables",
           *_CALLBACKS, *_LR, "INSTALL_HINT", "is_available"]
