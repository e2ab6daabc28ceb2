"""Keras 3's `keras.distribution` has no TensorFlow backend: tfdist supplies one.

Upstream: keras-team/keras#18473 (DTensor support in the TF backend, open since
2023), keras#18983 (the ModelParallel example fails on TF), keras#20625 (the
promise of a TF implementation removed from the docstring). In Keras 3.15.1
`keras/src/backend/tensorflow/distribution_lib.py` is a prototype headed "DO
NOT USE": `list_devices` and a `distribute_value` whose body is a TODO;
`initialize`, `num_processes`, `process_id` and `distribute_tensor` are
missing (`keras.distribution.initialize()` raises AttributeError), and no
TensorFlow backend file reads the distribution `set_distribution` sets, so
`DataParallel` and `ModelParallel` are accepted and `fit` runs on one device.

`install()` fills that module with the functions it is given
(`tfdist.keras_distribution.backend`) and joins Keras's distribution to an
engine's hooks (`tfdist.keras_distribution`):
`set_distribution` (and so `Distribution.scope`) also makes tfdist's engine
current, `Distribution.distribute_dataset` hands a process's rows to
TensorFlow so that it does not split them again, and `fit`, `evaluate` and
`predict` of a model under a ModelParallel run on its tensor-parallel copy.
`import tfdist` installs it when Keras (TensorFlow backend) is imported
(`when_keras_imported`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import sys

UPSTREAM = "keras-team/keras#18473 (Keras 3.15.1: no TensorFlow distribution backend)"
_state = {"installed": False, "gap": []}


class KerasDistributionInternalsChanged(RuntimeError):
    """The Keras internals this workaround joins moved."""


def upstream_gap() -> list[str]:
    """The backend functions Keras's TensorFlow module lacked when `install` filled it."""
    return list(_state["gap"])


def install(functions: dict, hooks) -> None:
    """Gives Keras's TensorFlow backend `functions` and joins `hooks` (once; no-op off TF).

    Args:
        functions: name -> the backend function Keras calls by that name.
        hooks: The engine: `on_set(distribution)` after `set_distribution`;
            `distribute_dataset(distribution, dataset, keras_part)` after
            Keras's `Distribution.distribute_dataset`; `splits(distribution)`
            and `run(model, method, original, args, kwargs)` for `fit`,
            `evaluate` and `predict` of a model under a distribution that
            splits weights.

    Raises:
        KerasDistributionInternalsChanged: when Keras moved what this joins.
    """
    if _state["installed"]:
        return
    import keras

    if keras.backend.backend() != "tensorflow":
        return
    import keras.distribution as public
    from keras.src.backend.tensorflow import distribution_lib as tf_lib
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
    from keras.src.distribution import distribution_lib as lib

    for needed in ("set_distribution", "Distribution"):
        if not hasattr(lib, needed):
            raise KerasDistributionInternalsChanged(
                f"keras.src.distribution.distribution_lib has no {needed} ({UPSTREAM}).")
    _state["installed"] = True
    _state["gap"] = [n for n in functions if not hasattr(tf_lib, n)]
    for name, function in functions.items():
        setattr(tf_lib, name, function)

    original_set = lib.set_distribution

    @functools.wraps(original_set)
    def set_distribution(value):
        previous = lib.distribution()
        original_set(value)
        try:
            hooks.on_set(value)
        except Exception:
            original_set(previous)  # refused: the previous distribution stays current
            raise

    lib.set_distribution = public.set_distribution = set_distribution
    original_dataset = lib.Distribution.distribute_dataset

    @functools.wraps(original_dataset)
    def distribute_dataset(self, dataset):
        return hooks.distribute_dataset(self, dataset, original_dataset(self, dataset))

    lib.Distribution.distribute_dataset = distribute_dataset
    for name in ("fit", "evaluate", "predict"):
        setattr(TensorFlowTrainer, name, _trainer_method(name, getattr(TensorFlowTrainer, name),
                                                         lib.distribution, hooks))


def _trainer_method(name, original, current, hooks):
    """`original` (a Trainer method), run by `hooks.run` under a distribution that splits weights."""

    @functools.wraps(original)
    def method(model, *args, **kwargs):
        distribution = current()
        if distribution is None or not hooks.splits(distribution):
            return original(model, *args, **kwargs)
        return hooks.run(model, name, original, args, kwargs)

    return method


class _AfterKeras(importlib.abc.Loader):
    """Keras's own loader, then `then()`."""

    def __init__(self, loader, then):
        self._loader, self._then = loader, then

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _KerasImportHook)]
        try:
            self._loader.exec_module(module)
        finally:
            if module.__loader__ is self:  # as if imported plainly
                module.__loader__ = module.__spec__.loader = self._loader
        try:
            self._then()
        except Exception as e:  # never break `import keras`: say why, once
            import warnings

            warnings.warn(f"tfdist could not give keras.distribution a TensorFlow backend: "
                          f"{type(e).__name__}: {e}", RuntimeWarning, stacklevel=2)


class _KerasImportHook(importlib.abc.MetaPathFinder):
    """Calls `then()` once `keras` is imported, then steps aside.

    It steps aside when Keras has run, not when it is looked up: TensorFlow's
    import asks `importlib.util.find_spec("keras")` before importing it.
    """

    def __init__(self, then):
        self._then, self._finding = then, False

    def find_spec(self, name, path=None, target=None):
        if name != "keras" or self._finding:
            return None
        self._finding = True
        try:
            spec = importlib.util.find_spec(name)  # the other finders' answer
        finally:
            self._finding = False
        if spec is not None and spec.loader is not None:
            spec.loader = _AfterKeras(spec.loader, self._then)
        return spec


def when_keras_imported(then) -> None:
    """Calls `then()` now if Keras is imported, else right after it is (once)."""
    if "keras" in sys.modules:
        then()
    elif not any(isinstance(f, _KerasImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _KerasImportHook(then))
