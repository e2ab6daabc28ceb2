"""A Keras 3 optimizer that keeps, and updates, only the variables its worker owns.

Keras's own update rules run unchanged: `build` learns each trainable
variable's owner (`partition.owners`) before the optimizer's own `build`
makes its slots, and `add_variable_from_reference` gives a variable another
worker owns a zero-size slot (a gradient accumulator stays whole: it holds
this worker's local gradient). `_backend_update_step` (reached once per
update, after the all-reduce, clipping and weight decay) updates the owned
variables only, then the engine's `gather` sets every variable to its owner's
value. Slots keep Keras's indexing, so `_get_variable_index` still works.

With an engine's `scatter` (multi_worker: `tfdist.zero.scatter`), the
gradients are not all-reduced: `_tfdist_reduce_grads` (which
`tfdist.compat.keras_grad_reduction` calls in place of the all-reduce) sums
each dense one onto its owner only, and `_clip_gradients` takes the global
norm over every worker's part (a scalar all-reduce of the owners' squares).
"""

from __future__ import annotations

import functools

from tfdist.zero import partition
from tfdist.zero import scatter as scatter_lib

# What a slot variable of the sharded optimizer carries: the whole-size slots and
# the zero-size ones alike are this worker's own, never broadcast or gathered.
SLOT_MARK = "_tfdist_shard_slot"
# Keras's name for the per-variable gradient accumulator (local gradients: whole everywhere).
ACCUMULATOR = "gradient_accumulator"


def variable_bytes(variable) -> int:
    """Bytes of a variable of static shape."""
    import numpy as np

    return int(np.prod(variable.shape, dtype=np.int64)) * np.dtype(variable.dtype).itemsize


class OwnedOnly:
    """The overrides of an optimizer that keeps, and updates, only its worker's variables,
    in front of a distributed optimizer class (see the module).

    `_sharded_class` sets, as class attributes: `_tfdist_over` (the class it
    extends), `_tfdist_gather`, `_tfdist_scatter` (None: gradients all-reduced),
    `_tfdist_rank`, `_tfdist_size`.
    """

    _tfdist_sharded = True
    _tfdist_whole_slots = (ACCUMULATOR,)  # local gradients: whole everywhere
    _tfdist_shard_level = "optimizer"

    def _owners_of(self, variables):
        if getattr(self, "_tfdist_owner", None) is None:  # apply() has not built it yet
            return partition.owners([variable_bytes(v) for v in variables], self._tfdist_size)
        return [self._tfdist_owner[self._var_key(v)] for v in variables]

    def _tfdist_reduce_grads(self, grads, variables):
        # Called in replica context in place of the all-reduce; None: all-reduce as before.
        if self._tfdist_scatter is None:
            return None
        self._tfdist_partial = True
        return self._tfdist_scatter(list(grads), self._owners_of(variables), self._tfdist_rank)

    def _backend_apply_gradients(self, grads, trainable_variables):
        if self._tfdist_scatter is not None:
            self._tfdist_applying = self._owners_of(trainable_variables)  # for _clip_gradients
        return self._tfdist_over._backend_apply_gradients(self, grads, trainable_variables)

    def _clip_gradients(self, grads):
        if not (self._tfdist_scatter is not None and getattr(self, "_tfdist_partial", False)
                and not (self.clipnorm or 0) > 0 and (self.global_clipnorm or 0) > 0):
            return self._tfdist_over._clip_gradients(self, grads)
        # Keras's clip_by_global_norm, its norm summed over the owners' parts (an unowned
        # dense gradient here is local, and is not used: it is left as it is).
        from tfdist.compat import tf_all_to_all

        return scatter_lib.clip_by_global_norm(grads, self._tfdist_applying, self._tfdist_rank,
                                               self.global_clipnorm, tf_all_to_all.all_reduce_sum)

    def build(self, variables):
        sizes = [variable_bytes(v) for v in variables]
        owner_of = partition.owners(sizes, self._tfdist_size)
        self._tfdist_owner = {self._var_key(v): o for v, o in zip(variables, owner_of)}
        self._tfdist_over.build(self, variables)
        # Before the first step, each worker says what it will hold.
        print(partition.holdings(sizes, self._tfdist_size, self._tfdist_rank,
                                 self._tfdist_shard_level, sum(
                                     variable_bytes(v) for v in self.variables
                                     if is_shard_slot(v))), flush=True)

    def add_variable_from_reference(self, reference_variable, name=None, initializer="zeros"):
        base = self._tfdist_over
        owner = getattr(self, "_tfdist_owner", {}).get(self._var_key(reference_variable))
        if owner is None or name in self._tfdist_whole_slots:
            return base.add_variable_from_reference(self, reference_variable, name=name,
                                                    initializer=initializer)
        with _outside_strategy():  # this worker's own: see tfdist.zero.mwms
            if owner == self._tfdist_rank:
                slot = base.add_variable_from_reference(self, reference_variable, name=name,
                                                        initializer=initializer)
            else:
                path = getattr(reference_variable, "path", reference_variable.name)
                slot = self.add_variable(shape=(0,), initializer=initializer,
                                         dtype=reference_variable.dtype,
                                         name=f"{path.replace('/', '_')}_{name or 'var'}")
        setattr(slot, SLOT_MARK, True)
        return slot

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        rank, gather = self._tfdist_rank, self._tfdist_gather
        owner_of = [self._tfdist_owner[self._var_key(v)] for v in trainable_variables]
        mine = [i for i, o in enumerate(owner_of) if o == rank]
        if mine:
            self._tfdist_over._backend_update_step(
                self, [grads[i] for i in mine], [trainable_variables[i] for i in mine],
                learning_rate)
        keep = getattr(gather, "keep", None)
        if keep is not None:
            # The gather waits for every reduced gradient, used here or not: an engine
            # whose all-reduce ops are not stateful (Horovod's) would otherwise have the
            # unused ones pruned from this worker's graph, and their owners wait for ever.
            gather(list(trainable_variables), owner_of, rank,
                   after=keep(scatter_lib.tensors_of(grads)))
        else:
            gather(list(trainable_variables), owner_of, rank)

    def save_own_variables(self, store):
        # A saved model is whole: it keeps the shared variables, not this worker's share
        # of the slots (Keras then skips the optimizer's variables on load, with a warning).
        for i, variable in enumerate(v for v in self.variables if not is_shard_slot(v)):
            store[str(i)] = variable.numpy()


@functools.cache
def _sharded_class(base: type, gather, rank: int, size: int, scatter=None) -> type:
    """`OwnedOnly` in front of `base` (a distributed optimizer class)."""
    return type(base.__name__, (OwnedOnly, base), {
        "__module__": base.__module__,
        "__doc__": f"{base.__name__} whose optimizer state is split across workers.",
        "_tfdist_sharded": True,  # gradients._keras_base: not Keras's own class
        "_tfdist_over": base,
        "_tfdist_gather": gather,
        "_tfdist_scatter": scatter,
        "_tfdist_rank": rank,
        "_tfdist_size": size,
    })


def _outside_strategy():
    """A scope whose variables skip the strategy's creator (a plain variable of this worker)."""
    import tensorflow as tf
    from tensorflow.python.ops import resource_variable_ops

    def creator(next_creator, **kwargs):
        return resource_variable_ops.default_variable_creator_v2(None, **kwargs)

    return tf.variable_creator_scope(creator)


def shard(distributed, gather, rank: int, size: int, scatter=None, level: str = "optimizer",
          engine=None):
    """A copy of `distributed` that keeps the optimizer state of its worker's variables only.

    Args:
        distributed: An unbuilt optimizer whose gradients are all-reduced before
            `_clip_gradients` returns (`tfdist.allreduce_optimizer.wrap`, or any
            optimizer under a strategy that reduces them first).
        gather: Hashable; `gather(variables, owners, rank)` sets each variable
            to the value its owner holds (inside the update step's graph).
        rank: This worker's rank.
        size: Data-parallel workers.
        scatter: Hashable or None; `scatter(grads, owners, rank)` returns the
            gradients with each owned dense one summed over workers, in place
            of the all-reduce (`tfdist.zero.scatter`); None: all-reduced.
        level: "optimizer" (ZeRO-1) or "gradients" (ZeRO-2: the gradients and
            accumulators too, `tfdist.zero.gradients`; needs `engine`).
        engine: Hashable or None; the engine's collectives for
            `scatter.owned_sums`: at "optimizer", the accumulated gradients are
            reduce-scattered in `_clip_gradients` in place of the
            DistributedOptimizer's all-reduce (`gradients.scattered_class`).

    Returns:
        A new optimizer of a subclass of `type(distributed)`, built from its
        config, with `distributed`'s own all-reduce (e.g. compressed) kept.

    Raises:
        ValueError: for one already built or already sharded, or a bad level.
    """
    if getattr(distributed, "_tfdist_sharded", False):
        raise ValueError(f"{type(distributed).__name__} already shards its state.")
    if getattr(distributed, "built", False):
        raise ValueError("shard() needs an optimizer that has not been built.")
    if level not in ("optimizer", "gradients") or (level == "gradients" and engine is None) or (
            scatter is not None and engine is not None):
        raise ValueError(f"level must be 'optimizer' or 'gradients' (with an engine), and "
                         f"scatter and engine are not both given. Received: level={level!r}, "
                         f"scatter={scatter!r}, engine={engine!r}.")
    cls = _sharded_class(type(distributed), gather, rank, size, scatter)
    if engine is not None:
        from tfdist.zero import gradients

        cls = (gradients.gradients_class if level == "gradients" else
               gradients.scattered_class)(cls, engine)
    return rebuilt(cls, distributed)


def rebuilt(cls: type, distributed):
    """A new optimizer of `cls` from `distributed`'s config, keeping `distributed`'s own
    all-reduce where it has one of its own (e.g. with_compression's)."""
    out = cls.from_config(distributed.get_config())
    if "_tfdist_allreduce" in vars(distributed):
        out._tfdist_allreduce = vars(distributed)["_tfdist_allreduce"]
    return out


def is_shard_slot(variable) -> bool:
    """Whether `variable` is a sharded optimizer's per-worker slot (never broadcast)."""
    return bool(getattr(variable, SLOT_MARK, False))


def is_per_worker(variable) -> bool:
    """Whether `variable` holds this worker's own values, never broadcast: a sharded
    optimizer's slot, or this worker's rows at `--shard parameters` (`zero.parameters.ROWS`:
    its attribute name is written here, as that module imports this one)."""
    return is_shard_slot(variable) or getattr(variable, "_tfdist_rows", None) is not None
