"""The reduce-scatter in the optimizer, as steps of `tfdist.gradient_path`: `--shard
gradients` (ZeRO stage 2, `ScatterFirst`), and `--shard optimizer` on shm and horovod
(`ScatterAccumulated`).

At "gradients", on top of `tfdist.zero.optimizer` (each worker keeps and updates the
optimizer state of the variables it owns): a worker keeps only the reduced
gradients, and the accumulators, of those variables.

Where it happens: the path's receive step (`_backend_apply_gradients`), which Keras
calls once per `apply` with this worker's local gradients (every engine's all-reduce
is skipped for this optimizer), reduce-scatters them (`scatter.owned_sums`: each
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

import dataclasses

from tfdist import gradient_path
from tfdist.zero import scatter as scatter_lib


@dataclasses.dataclass(frozen=True)
class ScatterFirst(gradient_path.Step):
    """`--shard gradients`: the local gradients reduce-scattered as Keras's apply receives
    them, in front of `OwnedOnly` (its rank, size and update step are used).

    Fields:
        engine: Hashable; the engine's collectives for `scatter.owned_sums`, with
            `all_sum(x)` (a scalar summed over the workers).
        owned: The path's `OwnedOnly` step.
    """

    engine: object
    owned: object

    marks = {"_tfdist_gets_reduced_grads": True,  # keras_grad_reduction: apply reduces nothing
             "_tfdist_scatters": True, "_tfdist_shard_level": "gradients"}

    def reduce_in_replica(self, opt, grads, variables, then):
        # keras_grad_reduction asks before Keras's apply: nothing is reduced there.
        return list(grads)

    def receive(self, opt, grads, trainable_variables, then):
        rank = self.owned.rank
        variables = list(trainable_variables)
        owner_of = self.owned.owners_of(opt, variables)
        summed, last = scatter_lib.owned_sums(self.engine, list(grads), owner_of, rank,
                                              self.owned.size)
        mine = [i for i, o in enumerate(owner_of) if o == rank]
        # Read while this step is traced: every variable for the gather, and the last
        # collective, which the next one waits for (a rank that owns nothing, or whose
        # norm is a constant, has no other edge from the scatter to its gather).
        gradient_path.set_trace_state(opt, variables=variables, owners=owner_of, last=last)
        return then([summed[i] for i in mine], [variables[i] for i in mine])

    def reduce(self, opt, grads, then):
        # The engine's all-reduce (AllReduce's) is skipped: these are the owned sums.
        return grads

    def clip(self, opt, grads, then):
        return _clip(opt, then, self.engine, grads, [self.owned.rank] * len(grads),
                     self.owned.rank)

    def accumulate(self, opt, grads, acc_grads, then):
        # Each worker's own plain variables (`optimizer._outside_strategy`): Keras's
        # extended.update would want a mirrored one under multi_worker.
        for g, acc in zip(grads, acc_grads):
            acc.assign_add(g)

    def update(self, opt, grads, trainable_variables, learning_rate, then):
        # Keras passes the owned variables only: the optimizer-level step (owned updates,
        # then the gather) gets every variable, None for the gradients of the others.
        step = gradient_path.trace_state(opt)
        index = {id(v): i for i, v in enumerate(step["variables"])}
        every = [None] * len(step["variables"])
        for g, v in zip(grads, trainable_variables):
            every[index[id(v)]] = g
        with _after(step["last"]):
            then(every, step["variables"], learning_rate)


@dataclasses.dataclass(frozen=True)
class ScatterAccumulated(gradient_path.Step):
    """`--shard optimizer` on an engine whose DistributedOptimizer all-reduces (shm,
    horovod): the accumulated gradients reduce-scattered onto their owners in place of
    the all-reduce, in front of `OwnedOnly`.

    Keras has accumulated the local gradients (each worker's accumulators stay
    whole, and the engine communicates once per update, as without sharding);
    each is then reduced onto its owner only (`scatter.owned_sums`), the others
    dropped, so no worker holds another's reduced gradient. Clipping and the
    gather are as at "gradients".

    Fields: as `ScatterFirst`'s.
    """

    engine: object
    owned: object

    marks = {"_tfdist_scatters": True}

    def receive(self, opt, grads, trainable_variables, then):
        variables = list(trainable_variables)
        gradient_path.set_trace_state(
            opt, variables=variables, last=None,
            owners=self.owned.owners_of(opt, variables))
        return then(grads, variables)

    def reduce(self, opt, grads, then):
        # In place of the DistributedOptimizer's all-reduce: unowned gradients become None
        # (the update step reads the owned ones only).
        step = gradient_path.trace_state(opt)
        grads, step["last"] = scatter_lib.owned_sums(self.engine, list(grads), step["owners"],
                                                     self.owned.rank, self.owned.size)
        return grads

    def clip(self, opt, grads, then):
        return _clip(opt, then, self.engine, grads, gradient_path.trace_state(opt)["owners"],
                     self.owned.rank)

    def update(self, opt, grads, trainable_variables, learning_rate, then):
        with _after(gradient_path.trace_state(opt)["last"]):
            then(grads, trainable_variables, learning_rate)


def _clip(optimizer, then, engine, grads, owners, rank: int) -> list:
    """Keras's clipping of the owned sums (`then`: Keras's own); by global norm, the norm
    summed over the workers by one scalar all-reduce that waits for the step's last
    collective."""
    if not ((optimizer.global_clipnorm or 0) > 0 and not (optimizer.clipnorm or 0) > 0):
        return then(grads)
    step = gradient_path.trace_state(optimizer)

    def all_sum(x):
        with _after(step["last"]):
            step["last"] = total = engine.all_sum(x)
        return total

    return scatter_lib.clip_by_global_norm(grads, owners, rank, optimizer.global_clipnorm,
                                           all_sum)


def _after(tensor):
    """Ops made in this scope run after `tensor` (None: no constraint)."""
    import contextlib

    import tensorflow as tf

    return contextlib.nullcontext() if tensor is None else tf.control_dependencies([tensor])
