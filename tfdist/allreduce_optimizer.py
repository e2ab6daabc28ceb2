"""Any Keras 3 optimizer, with its gradients allreduced before they apply.

Shared by every engine whose replicas are processes TensorFlow does not see
(Horovod, the shared-memory engine): each passes the function that
allreduces a list of gradients.

Where the allreduce goes: the reduce step of `tfdist.gradient_path`, which Keras 3's
`BaseOptimizer._backend_apply_gradients` reaches (at the start of `_clip_gradients`)
exactly once per *update* step, after its own
gradient accumulation (`gradient_accumulation_steps`) and before clipping and
the update. Allreducing there gives the single-replica semantics (clipping
sees the global gradient, as it would on one replica) and, with
`backward_passes_per_step=k`, communicates once every k passes instead of
every pass. It serves `model.fit` and custom loops alike, because both end
in `optimizer.apply`. `tfdist.compat.horovod_keras.check_optimizer_hook`
refuses to wrap when Keras moves that hook.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

from tfdist import compression as compression_lib
from tfdist import gradient_path
from tfdist.compat import horovod_keras
from tfdist.zero.optimizer import is_per_worker, save_shared


@dataclasses.dataclass(frozen=True)
class AllReduce(gradient_path.Step):
    """The path's reduce: the gradients all-reduced across processes (`wrap`).

    Fields:
        allreduce: Hashable; what `wrap` takes. An optimizer's own
            `_tfdist_allreduce` (e.g. `with_compression`'s) is used in its place.
        average_passes: As in `wrap`.
    """

    allreduce: Callable[[list], list]
    average_passes: bool = True

    @property
    def marks(self) -> dict:
        # A class attribute, not an instance one, so that `cls.from_config(opt.get_config())`
        # (Keras's copy, and what `keras.models.load_model` calls with the class given in
        # `custom_objects`) gives a working distributed optimizer.
        return {"_tfdist_distributed": True, "_tfdist_allreduce": self.allreduce}

    def reduce(self, opt, grads, then):
        grads = opt._tfdist_allreduce(grads)
        steps = opt.gradient_accumulation_steps
        if not self.average_passes and steps:
            # Keras divided the accumulated passes by `steps`: undo it for their sum.
            grads = [_scaled(g, steps) for g in grads]
        return then(grads)


@functools.cache
def _distributed_class(base: type, allreduce: Callable[[list], list],
                       average_passes: bool = True) -> type:
    """`base` with its gradients all-reduced first (`AllReduce`; one class per spec:
    engines pass hashable allreduce specs, so equal options share one class)."""
    horovod_keras.check_optimizer_hook(gradient_path.keras_class(base))
    return gradient_path.extended(base, AllReduce(allreduce, average_passes))


def distributed_class(base: type, allreduce: Callable[[list], list],
                      average_passes: bool = True) -> type:
    """The class of `wrap(base(...), allreduce)`: `from_config` builds working copies.

    Args:
        base: A Keras 3 optimizer class.
        allreduce: As in `wrap`; hashable (equal specs share one class).
        average_passes: As in `wrap`.

    Raises:
        ValueError: when `base` is itself distributed.
    """
    if getattr(base, "_tfdist_distributed", False):
        raise ValueError(f"{base.__name__} is already a DistributedOptimizer.")
    return _distributed_class(base, allreduce, bool(average_passes))


def wrap(optimizer, allreduce: Callable[[list], list], backward_passes_per_step: int = 1,
         average_passes: bool = True):
    """A new optimizer like `optimizer` whose gradients go through `allreduce` first.

    Args:
        optimizer: An unbuilt `keras.optimizers.Optimizer`.
        allreduce: Maps the list of gradients (tensors, IndexedSlices or
            None) to the reduced list, the same on every process. Hashable:
            it becomes an attribute of the returned optimizer's class.
        backward_passes_per_step: Accumulate this many local gradients
            (Keras 3's `gradient_accumulation_steps`) and allreduce and apply
            their mean once; the optimizer updates every k-th call.
        average_passes: False applies the sum of the k accumulated passes
            instead of their mean (Horovod's
            `average_aggregated_gradients=False`).

    Returns:
        A new instance of a subclass of `type(optimizer)`, built from
        `optimizer.get_config()` (so wrap before training). Its class's
        `from_config` makes further working copies.

    Raises:
        ValueError: for a bad `backward_passes_per_step`, an optimizer that
            is already built or already distributed, or one whose own
            accumulation disagrees.
    """
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be an integer >= 1. Received: "
                         f"backward_passes_per_step={backward_passes_per_step!r}.")
    if getattr(optimizer, "_tfdist_distributed", False):
        raise ValueError(f"{type(optimizer).__name__} is already a DistributedOptimizer.")
    if getattr(optimizer, "built", False):
        raise ValueError("DistributedOptimizer needs an optimizer that has not been built "
                         "(wrap it before compile/fit or its first apply).")
    config = optimizer.get_config()
    own = config.get("gradient_accumulation_steps")
    if backward_passes_per_step > 1:
        if own and own != backward_passes_per_step:
            raise ValueError(
                f"The optimizer already accumulates gradient_accumulation_steps={own}, which "
                f"disagrees with backward_passes_per_step={backward_passes_per_step}.")
        config["gradient_accumulation_steps"] = backward_passes_per_step
    return distributed_class(type(optimizer), allreduce, average_passes).from_config(config)


def _scaled(g, factor):
    """`g * factor` for a tensor or IndexedSlices (None stays None)."""
    if g is None:
        return g
    import tensorflow as tf

    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(g.values * factor, g.indices, dense_shape=g.dense_shape)
    return g * tf.cast(factor, g.dtype)


def with_compression(distributed, compression: str):
    """`distributed` (from `wrap`) with its gradients cast for the all-reduce and back.

    Args:
        distributed: An optimizer `wrap` returned, not yet built.
        compression: "none", "fp16" or "bf16" (see `tfdist.compression`).

    Returns:
        `distributed` itself.

    Raises:
        ConfigError: for an unknown compression.
    """
    distributed._tfdist_allreduce = compression_lib.wrap_allreduce(
        distributed._tfdist_allreduce, compression)
    return distributed


def state_variables(model, optimizer=None) -> list:
    """The variables an initial-state broadcast sends: the model's, then its optimizer's.

    The optimizer (`model.optimizer` when None) is built on the model's
    trainable variables first if it is not, so that its slots (momentum,
    iterations) exist on every process and go too. Same order everywhere.
    A sharded optimizer's slots, and a split model's rows (`tfdist.zero`), are each
    worker's own and stay.
    """
    optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
    variables = [v for v in model.variables if not is_per_worker(v)]
    if optimizer is not None:
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        variables += [v for v in optimizer.variables if not is_per_worker(v)]
    return variables


@dataclasses.dataclass(frozen=True)
class Agree(gradient_path.Step):
    """A LossScaleOptimizer's finite check agreed by every process: all skip a step
    when any process's gradients are not finite (`loss_scale_if_float16`).

    Fields:
        all_true: Hashable; maps this process's scalar boolean to True only when it
            is True on every process.
    """

    all_true: Callable

    def finite(self, opt, grads, then):
        return self.all_true(then(grads))

    def save(self, opt, store, then):
        # A sharded inner optimizer's slots are its worker's share (as without loss scaling).
        save_shared(opt, store)


def loss_scale_if_float16(optimizer, all_true: Callable):
    """Wraps a distributed optimizer in a LossScaleOptimizer under `mixed_float16`.

    Why: Keras's own LossScaleOptimizer (which `compile` adds for
    mixed_float16) decides from this process's *unreduced* gradients whether
    to skip the step. With one replica per process, a rank whose gradients
    overflowed skips its update, and with it the all-reduce inside it, while
    the others apply: their all-reduces then pair with the wrong steps and
    the ranks silently diverge. Here every process's verdict is combined
    first (`all_true`), so all skip together or all apply.

    Args:
        optimizer: The optimizer `wrap` returned.
        all_true: Maps this process's scalar boolean tensor to True only when
            it is True on every process (a min all-reduce).

    Returns:
        `optimizer` unchanged for any other global dtype policy, else the
        LossScaleOptimizer around it (`compile` then adds no other).
    """
    import keras

    if keras.mixed_precision.global_policy().name != "mixed_float16":
        return optimizer
    if not hasattr(keras.optimizers.LossScaleOptimizer, "check_finite"):
        raise horovod_keras.KerasOptimizerInternalsChanged(
            f"Keras {keras.__version__}: LossScaleOptimizer has no check_finite, where tfdist "
            "makes processes agree on skipping a step. Refusing mixed_float16 with one replica "
            "per process.")
    return gradient_path.extended(keras.optimizers.LossScaleOptimizer, Agree(all_true))(
        optimizer)
