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

import dataclasses

from tfdist import gradient_path
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


@dataclasses.dataclass(frozen=True)
class OwnedOnly(gradient_path.Step):
    """The path's steps of an optimizer that keeps, and updates, only its worker's
    variables (see the module).

    Fields:
        gather: Hashable; `gather(variables, owners, rank)` (see `shard`).
        rank: This worker's rank.
        size: Data-parallel workers.
        scatter: Hashable or None; see `shard` (None: gradients all-reduced).
        level: "optimizer", or "gradients" (the accumulators are the owner's only).
    """

    gather: object
    rank: int
    size: int
    scatter: object = None
    level: str = "optimizer"

    @property
    def marks(self) -> dict:
        return {"_tfdist_sharded": True, "_tfdist_shard_level": self.level}

    def describe(self) -> str:
        return f"OwnedOnly (worker {self.rank} of {self.size})"

    def owners_of(self, opt, variables) -> list:
        """Each variable's owning worker."""
        if getattr(opt, "_tfdist_owner", None) is None:  # apply() has not built it yet
            return partition.owners([variable_bytes(v) for v in variables], self.size)
        return [opt._tfdist_owner[opt._var_key(v)] for v in variables]

    def reduce_in_replica(self, opt, grads, variables, then):
        # Called in replica context in place of the all-reduce.
        if self.scatter is None:
            return then(grads, variables)
        opt._tfdist_partial = True  # declared in gradient_path: a fact of the run, read later
        return self.scatter(list(grads), self.owners_of(opt, variables), self.rank)

    def receive(self, opt, grads, trainable_variables, then):
        if self.scatter is not None:  # for clip
            gradient_path.set_trace_state(opt, applying=self.owners_of(opt, trainable_variables))
        return then(grads, trainable_variables)

    def clip(self, opt, grads, then):
        if not (self.scatter is not None and getattr(opt, "_tfdist_partial", False)
                and not (opt.clipnorm or 0) > 0 and (opt.global_clipnorm or 0) > 0):
            return then(grads)
        # Keras's clip_by_global_norm, its norm summed over the owners' parts (an unowned
        # dense gradient here is local, and is not used: it is left as it is).
        from tfdist.compat import tf_all_to_all

        return scatter_lib.clip_by_global_norm(
            grads, gradient_path.trace_state(opt)["applying"], self.rank, opt.global_clipnorm,
            tf_all_to_all.all_reduce_sum)

    def build(self, opt, variables, then):
        sizes = [variable_bytes(v) for v in variables]
        owner_of = partition.owners(sizes, self.size)
        opt._tfdist_owner = {opt._var_key(v): o for v, o in zip(variables, owner_of)}
        then(variables)
        # Before the first step, each worker says what it will hold.
        print(partition.holdings(sizes, self.size, self.rank, self.level, sum(
            variable_bytes(v) for v in opt.variables if is_shard_slot(v))), flush=True)

    def make_slot(self, opt, reference_variable, name, initializer, then):
        owner = getattr(opt, "_tfdist_owner", {}).get(opt._var_key(reference_variable))
        if owner is None or (name == ACCUMULATOR and self.level == "optimizer"):
            # A gradient accumulator holds local gradients at "optimizer": whole everywhere.
            return then(reference_variable, name, initializer)
        with _outside_strategy():  # this worker's own: see tfdist.zero.mwms
            if owner == self.rank:
                slot = then(reference_variable, name, initializer)
            else:
                path = getattr(reference_variable, "path", reference_variable.name)
                slot = opt.add_variable(shape=(0,), initializer=initializer,
                                        dtype=reference_variable.dtype,
                                        name=f"{path.replace('/', '_')}_{name or 'var'}")
        setattr(slot, SLOT_MARK, True)
        return slot

    def update(self, opt, grads, trainable_variables, learning_rate, then):
        rank, gather = self.rank, self.gather
        owner_of = self.owners_of(opt, trainable_variables)
        mine = [i for i, o in enumerate(owner_of) if o == rank]
        if mine:
            then([grads[i] for i in mine], [trainable_variables[i] for i in mine],
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

    def save(self, opt, store, then):
        save_shared(opt, store)


def save_shared(optimizer, store) -> None:
    """Keras's `save_own_variables` without this worker's share of the slots: a saved
    model is whole, so it keeps the shared variables only (Keras then skips the
    optimizer's variables on load, with a warning)."""
    for i, variable in enumerate(v for v in optimizer.variables if not is_shard_slot(v)):
        store[str(i)] = variable.numpy()


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
    owned = OwnedOnly(gather, rank, size, scatter, level)
    cls = gradient_path.extended(type(distributed), owned)
    if engine is not None:
        from tfdist.zero import gradients

        cls = gradient_path.extended(cls, (gradients.ScatterFirst if level == "gradients" else
                                           gradients.ScatterAccumulated)(engine, owned))
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
