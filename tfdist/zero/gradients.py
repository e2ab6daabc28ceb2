"""The reduce-scatter in the optimizer: `--shard gradients` (ZeRO stage 2,
`gradients_class`), and `--shard optimizer` on shm and horovod (`scattered_class`).

At "gradients", on top of `tfdist.zero.optimizer` (each worker keeps and updates the
optimizer state of the variables it owns): a worker keeps only the reduced
gradients, and the accumulators, of those variables.

Where it happens: `_backend_apply_gradients`, which Keras calls once per
`apply` with this worker's local gradients (every engine's all-reduce is
skipped for this optimizer), reduce-scatters them (`scatter.owned_sums`: each
dense gradient summed onto its owner only; sparse ones gathered whole and
kept by their owner) and hands Keras only the owned variables and their
sums. Keras's own code then accumulates, clips and updates those alone; the
unowned gradients are used by nothing after the scatter, so TensorFlow frees
each once its piece is sent, and an unowned accumulator is a zero-size slot.
After an update every worker receives each variable from its owner (the
engine's gather, as at `--shard optimizer`).

What the gradient features see, equal to one replica's math:
- accumulation: each micro-batch is reduce-scattered, and the owner sums
  the sums (the step's mean over micro-batches, as Keras divides);
- global-norm clipping: the norm adds every owner's squared norm of its
  sums (one scalar all-reduce, `engine.all_sum`);
- mixed precision: the LossScaleOptimizer's finite check reads the local
  gradients before `apply` and every worker's verdict is combined (an inf or
  NaN anywhere is one in its owner's sum), so all skip or all apply;
- gradient compression is refused (`partition.check_config`).
"""

from __future__ import annotations

import functools

from tfdist.zero import scatter as scatter_lib


def _keras_base(cls: type) -> type:
    """The first class in `cls`'s MRO that is Keras's own (not a tfdist subclass)."""
    return next(c for c in cls.__mro__
                if not {"_tfdist_sharded", "_tfdist_distributed"} & set(vars(c)))


@functools.cache
def gradients_class(sharded: type, engine) -> type:
    """A subclass of `sharded` (a `tfdist.zero.optimizer` class) that reduce-scatters.

    Args:
        sharded: The optimizer-state-sharded class (its `_tfdist_rank`,
            `_tfdist_size` and its update step, owned updates then the gather,
            are used).
        engine: Hashable; the engine's collectives for `scatter.owned_sums`,
            with `all_sum(x)` (a scalar summed over the workers).
    """
    keras_base = _keras_base(sharded)
    rank, size = sharded._tfdist_rank, sharded._tfdist_size

    def _tfdist_reduce_grads(self, grads, variables):
        # keras_grad_reduction asks before Keras's apply: nothing is reduced there.
        return list(grads)

    def _backend_apply_gradients(self, grads, trainable_variables):
        variables = list(trainable_variables)
        owner_of = [self._tfdist_owner[self._var_key(v)] for v in variables]
        summed, last = scatter_lib.owned_sums(engine, list(grads), owner_of, rank, size)
        mine = [i for i, o in enumerate(owner_of) if o == rank]
        # Read while this step is traced: every variable for the gather, and the last
        # collective, which the next one waits for (a rank that owns nothing, or whose
        # norm is a constant, has no other edge from the scatter to its gather).
        _set_step(self, {"variables": variables, "owners": owner_of, "last": last})
        return keras_base._backend_apply_gradients(
            self, [summed[i] for i in mine], [variables[i] for i in mine])

    def _clip_gradients(self, grads):
        # The engine's all-reduce (a DistributedOptimizer's _clip_gradients) is skipped:
        # these are the owned sums.
        return _clip(self, keras_base, engine, grads, [rank] * len(grads), rank)

    def _backend_increment_gradient_accumulators(self, grads, acc_grads):
        # Each worker's own plain variables (`optimizer._outside_strategy`): Keras's
        # extended.update would want a mirrored one under multi_worker.
        for g, acc in zip(grads, acc_grads):
            acc.assign_add(g)

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        # Keras passes the owned variables only: the optimizer-level step (owned updates,
        # then the gather) gets every variable, None for the gradients of the others.
        step = self._tfdist_step
        index = {id(v): i for i, v in enumerate(step["variables"])}
        every = [None] * len(step["variables"])
        for g, v in zip(grads, trainable_variables):
            every[index[id(v)]] = g
        with _after(step["last"]):
            sharded._backend_update_step(self, every, step["variables"], learning_rate)

    return type(sharded.__name__, (sharded,), {
        "_tfdist_reduce_grads": _tfdist_reduce_grads,
        "_backend_apply_gradients": _backend_apply_gradients,
        "_clip_gradients": _clip_gradients,
        "_backend_update_step": _backend_update_step,
        "_backend_increment_gradient_accumulators": _backend_increment_gradient_accumulators,
        "_tfdist_gets_reduced_grads": True,  # keras_grad_reduction: apply reduces nothing
        "_tfdist_whole_slots": (),  # accumulators too: only the owner's
        "_tfdist_scatters": True,
        "_tfdist_shard_level": "gradients",
        "__module__": sharded.__module__,
        "__doc__": f"{sharded.__name__} whose optimizer state and gradients are split "
                   "across workers.",
    })


@functools.cache
def scattered_class(sharded: type, engine) -> type:
    """A subclass of `sharded` (a `tfdist.zero.optimizer` class of an engine whose
    DistributedOptimizer all-reduces in `_clip_gradients`: shm, horovod) that
    reduce-scatters there instead, at `--shard optimizer`.

    Keras has accumulated the local gradients (each worker's accumulators stay
    whole, and the engine communicates once per update, as without sharding);
    each is then reduced onto its owner only (`scatter.owned_sums`), the others
    dropped, so no worker holds another's reduced gradient. Clipping and the
    gather are as at "gradients".
    """
    keras_base = _keras_base(sharded)
    rank, size = sharded._tfdist_rank, sharded._tfdist_size

    def _backend_apply_gradients(self, grads, trainable_variables):
        variables = list(trainable_variables)
        _set_step(self, {"variables": variables, "last": None,
                         "owners": [self._tfdist_owner[self._var_key(v)] for v in variables]})
        return sharded._backend_apply_gradients(self, grads, variables)

    def _clip_gradients(self, grads):
        # In place of the DistributedOptimizer's all-reduce: unowned gradients become None
        # (the update step reads the owned ones only).
        step = self._tfdist_step
        grads, step["last"] = scatter_lib.owned_sums(engine, list(grads), step["owners"],
                                                     rank, size)
        return _clip(self, keras_base, engine, grads, step["owners"], rank)

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        with _after(self._tfdist_step["last"]):
            sharded._backend_update_step(self, grads, trainable_variables, learning_rate)

    return type(sharded.__name__, (sharded,), {
        "_backend_apply_gradients": _backend_apply_gradients,
        "_clip_gradients": _clip_gradients,
        "_backend_update_step": _backend_update_step,
        "_tfdist_scatters": True,
        "__module__": sharded.__module__,
        "__doc__": f"{sharded.__name__} whose optimizer state is split across workers, its "
                   "gradients reduce-scattered onto their owners.",
    })


def _clip(optimizer, keras_base, engine, grads, owners, rank: int) -> list:
    """Keras's clipping of the owned sums; by global norm, the norm summed over the
    workers by one scalar all-reduce that waits for the step's last collective."""
    if not ((optimizer.global_clipnorm or 0) > 0 and not (optimizer.clipnorm or 0) > 0):
        return keras_base._clip_gradients(optimizer, grads)
    step = optimizer._tfdist_step

    def all_sum(x):
        with _after(step["last"]):
            step["last"] = total = engine.all_sum(x)
        return total

    return scatter_lib.clip_by_global_norm(grads, owners, rank, optimizer.global_clipnorm,
                                           all_sum)


def _set_step(optimizer, step: dict) -> None:
    """Keeps what the step being traced needs, out of Keras's tracking: an attribute
    set the usual way would have the optimizer track the model's variables in it as
    its own (and save them with its state)."""
    optimizer.__dict__["_tfdist_step"] = step


def _after(tensor):
    """Ops made in this scope run after `tensor` (None: no constraint)."""
    import contextlib

    import tensorflow as tf

    return contextlib.nullcontext() if tensor is None else tf.control_dependencies([tensor])
