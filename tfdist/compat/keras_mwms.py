"""Keras 3 `fit`/`evaluate`/`predict` under MultiWorkerMirroredStrategy.

Upstream: keras-team/keras#20585, tensorflow/tensorflow#72388,
ray-project/ray#47464. Two root causes, both in
`keras/src/backend/tensorflow/trainer.py` (measured on Keras 3.15.1, TF 2.21):

1. `TensorFlowTrainer._maybe_symbolic_build` calls
   `strategy.reduce("MEAN", per_replica_batch, axis=None)` eagerly to get one
   example batch for building the model. Under MWMS that is a cross-worker
   collective on input data and raises
   `ValueError: Attempt to convert a value (PerReplica:...)`. Any local
   replica's batch has the right shapes, so we take the first local one.
2. `reduce_per_replica(..., reduction="mean")` in multi-worker mode calls
   `strategy.reduce("MEAN", v, axis=0)` on rank-0 metric results and raises
   `Invalid reduction dimension 0 for input with 0 dimensions`. Metric
   results are read from synchronized variables, so they are already the
   global value on every replica: a rank-0 value is returned as is.

`apply()` patches both, once, and only if the installed Keras still has the
code it replaces; if the internals moved it raises `KerasInternalsChanged`
so that nobody trains on a silently unpatched Keras.
"""

from __future__ import annotations

import inspect

UPSTREAM_ISSUES = ("keras-team/keras#20585", "tensorflow/tensorflow#72388")

_state = {"applied": False, "original_reduce": None, "original_build": None}


class KerasInternalsChanged(RuntimeError):
    """The Keras internals this workaround patches are not where it expects."""


def _trainer_module():
    from keras.src.backend.tensorflow import trainer

    return trainer


def is_needed() -> bool:
    """True when the installed Keras still has the upstream bug.

    Raises:
        KerasInternalsChanged: when the functions to patch are missing.
    """
    trainer = _trainer_module()
    cls = getattr(trainer, "TensorFlowTrainer", None)
    missing = [name for name, obj in (
        ("TensorFlowTrainer", cls),
        ("TensorFlowTrainer._maybe_symbolic_build", getattr(cls, "_maybe_symbolic_build", None)),
        ("TensorFlowTrainer._symbolic_build", getattr(cls, "_symbolic_build", None)),
        ("reduce_per_replica", getattr(trainer, "reduce_per_replica", None)),
        ("_collective_all_reduce_multi_worker",
         getattr(trainer, "_collective_all_reduce_multi_worker", None)),
    ) if obj is None]
    if missing:
        import keras

        raise KerasInternalsChanged(
            f"tfdist's workaround for {', '.join(UPSTREAM_ISSUES)} cannot be applied to "
            f"keras {keras.__version__}: keras.src.backend.tensorflow.trainer no longer has "
            f"{', '.join(missing)}. Keras `fit` under MultiWorkerMirroredStrategy may fail or "
            "misbehave. HINT: install a keras version listed as tested in tfdist's README, "
            "or update tfdist/compat/keras_mwms.py.")
    build_src = inspect.getsource(_state["original_build"] or cls._maybe_symbolic_build)
    return "distribute_strategy.reduce(" in build_src


def _first_local(strategy, value):
    import tensorflow as tf

    if isinstance(value, tf.distribute.DistributedValues):
        return strategy.experimental_local_results(value)[0]
    return value


def _maybe_symbolic_build(self, iterator=None, data_batch=None):
    """Replacement that takes a local batch instead of a cross-worker reduce."""
    from keras.src import tree

    if self._distribute_strategy is None:
        return
    if iterator is not None:
        for _, _, it in iterator:
            batch = next(it)
            data_batch = tree.map_structure(
                lambda x: _first_local(self.distribute_strategy, x), batch)
            break
    with self.distribute_strategy.scope():
        self._symbolic_build(data_batch=data_batch)


def _reduce_per_replica(values, strategy, reduction):
    """Replacement that leaves already-synchronized scalar metrics alone."""
    from keras.src import tree

    trainer = _trainer_module()
    original = _state["original_reduce"]
    if reduction in ("auto", "mean") and trainer._collective_all_reduce_multi_worker(strategy):

        def reduce_one(v):
            local = _first_local(strategy, v)
            if getattr(local, "shape", None) is not None and local.shape.rank == 0:
                return local
            return original(v, strategy, reduction)

        return tree.map_structure(reduce_one, values)
    return original(values, strategy, reduction)


def apply() -> bool:
    """Patches Keras once if it needs it.

    Returns:
        True if the patch is (now) in place, False if this Keras does not
        need it.

    Raises:
        KerasInternalsChanged: if Keras no longer has the patched internals.
    """
    if _state["applied"]:
        return True
    if not is_needed():
        return False
    trainer = _trainer_module()
    _state["original_build"] = trainer.TensorFlowTrainer._maybe_symbolic_build
    _state["original_reduce"] = trainer.reduce_per_replica
    trainer.TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build
    # The step functions look `reduce_per_replica` up as a module global at
    # trace time, so replacing the global is enough.
    trainer.reduce_per_replica = _reduce_per_replica
    _state["applied"] = True
    return True


def revert() -> None:
    """Restores the original Keras functions (used by the test that shows the bug)."""
    if not _state["applied"]:
        return
    trainer = _trainer_module()
    trainer.TensorFlowTrainer._maybe_symbolic_build = _state["original_build"]
    trainer.reduce_per_replica = _state["original_reduce"]
    _state["applied"] = False
