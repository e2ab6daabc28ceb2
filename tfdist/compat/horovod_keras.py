"""Horovod's Keras layer on Keras 3: why tfdist does not use it, and the hook it uses.

Upstream (horovod 0.28.1, the newest release; Keras 3.15.1):

1. horovod#4290: the Keras `BroadcastGlobalVariablesCallback` fails on
   Keras 3 models with `AttributeError: 'Variable' object has no attribute
   'ref'` (it keys variables by `tf.Variable.ref()`, which Keras 3's Variable
   lacks). `horovod.tensorflow.broadcast_variables` on Keras 3 variables fails
   too, differently: inside its tf.function the variable arrives as a tensor
   (`'SymbolicTensor' object has no attribute 'assign'`). tfdist broadcasts
   each variable's value and assigns it back (`tfdist.horovod.broadcast`).
2. `horovod.tensorflow.keras.DistributedOptimizer` builds fine on a Keras 3
   optimizer, but it averages gradients in
   `_aggregate_gradients`, a hook of the Keras 2 optimizer (optimizer_v2).
   Keras 3's optimizers never call it, so a wrapped Keras 3 optimizer applies
   each rank's own gradients: ranks drift apart, silently. tfdist allreduces
   in Keras 3's `_clip_gradients` step instead (`tfdist.horovod.optimizer`).

All three are shown with real `horovodrun` ranks (tests/workers/hvd_checks.py,
checks `upstream_*`, run by tests/integration/test_horovod.py).
`check_optimizer_hook` guards the one Keras internal tfdist relies on, so
that a Keras that moves it fails loudly instead of training un-averaged.
"""

from __future__ import annotations

import inspect

UPSTREAM_ISSUES = ("horovod/horovod#4290",)


class KerasOptimizerInternalsChanged(RuntimeError):
    """Keras no longer routes update steps through `_clip_gradients`."""


def check_optimizer_hook(optimizer_class: type) -> None:
    """Raises unless Keras calls `_clip_gradients` once per update step.

    Args:
        optimizer_class: The Keras 3 optimizer class to wrap.

    Raises:
        TypeError: when it is not a Keras 3 optimizer.
        KerasOptimizerInternalsChanged: when the hook moved.
    """
    from keras.src.optimizers import base_optimizer

    base = base_optimizer.BaseOptimizer
    if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, base)):
        raise TypeError("DistributedOptimizer wraps Keras 3 optimizers (keras.optimizers.*). "
                        f"Received: {optimizer_class!r}.")
    apply_src = inspect.getsource(base._backend_apply_gradients)
    if not hasattr(optimizer_class, "_clip_gradients") or \
            apply_src.count("self._clip_gradients(") != 2 or \
            optimizer_class._backend_apply_gradients is not base._backend_apply_gradients:
        import keras

        raise KerasOptimizerInternalsChanged(
            f"Keras {keras.__version__}: {optimizer_class.__name__} no longer applies updates "
            "through BaseOptimizer._backend_apply_gradients -> _clip_gradients, where "
            "tfdist allreduces gradients. Refusing to train without averaging.\n"
            "HINT: use the Keras version tfdist was tested with (3.15.1) and report this.")
