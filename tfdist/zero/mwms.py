"""Every replica gets each variable from its owner, under MultiWorkerMirroredStrategy.

Why the slots can differ per worker there: MultiWorkerMirrored makes every
variable created in its scope a MirroredVariable, whose initial value worker 0
broadcasts, so all workers' copies must have one shape. A sharded slot is
whole on its owner and zero-size elsewhere, so `tfdist.zero.optimizer` creates
every sharded slot outside the strategy's variable creator, as a plain
variable of this worker: Keras's update (run on the worker's one replica,
inside `extended.update`) reads and writes it like any slot, and no collective
ever touches it.

The gather runs where Keras applied the update (in replica context, or in
cross-replica context when `tfdist.compat.keras_grad_reduction` applies an
accumulated step there), right after the owned updates: round by
round (`partition.rounds`, each rank's k-th largest variable), each replica
flattens its variable of the round, pads it to the round's largest, and one
`all_gather` brings every rank's; the received variables are assigned the
way Keras applies an update (`extended.update`, through merge_call where the
strategy needs it). In a `tf.function` the collectives and assigns run in
program order, so one round's buffers are alive at a time.
"""

from __future__ import annotations

import dataclasses

from tfdist.zero import partition


@dataclasses.dataclass(frozen=True)
class ReplicaGather:
    """Sets every variable to its owner's value (hashable: a sharded optimizer's class attribute)."""

    def __call__(self, variables, owners, rank):
        import numpy as np
        import tensorflow as tf

        strategy = tf.distribute.get_strategy()
        n = strategy.num_replicas_in_sync
        if n == 1:
            return
        ctx = tf.distribute.get_replica_context()  # None: applied in cross-replica context
        by_dtype: dict = {}
        for i, v in enumerate(variables):
            by_dtype.setdefault(np.dtype(v.dtype), []).append(i)
        for index in by_dtype.values():
            sizes = [variables[i].shape.num_elements() for i in index]
            for members in partition.rounds(sizes, [owners[i] for i in index], n):
                _gather_round(strategy, ctx, [None if m is None else variables[index[m]]
                                              for m in members], rank)


def _gather_round(strategy, ctx, members, rank: int) -> None:
    """One all_gather: member q (rank q's variable, or None) reaches every rank."""
    import tensorflow as tf

    sizes = [0 if v is None else v.shape.num_elements() for v in members]
    width = max(sizes)
    dtype = next(v for v in members if v is not None).dtype
    mine = members[rank]
    flat = tf.zeros([0], dtype) if mine is None else tf.reshape(mine.value, [-1])
    if sizes[rank] < width:
        flat = tf.concat([flat, tf.zeros([width - sizes[rank]], dtype)], 0)
    if ctx is not None:
        gathered = ctx.all_gather(flat, axis=0)
    else:  # with accumulation, MirroredStrategy-like engines apply in cross-replica context
        gathered = strategy.gather(
            strategy.experimental_distribute_values_from_function(lambda _: flat), axis=0)
    targets, values = [], []
    for q, v in enumerate(members):
        if v is not None and q != rank:
            targets.append(v.value)
            values.append(tf.reshape(gathered[q * width:q * width + sizes[q]], v.shape))
    if targets and ctx is None:
        _assign(strategy, targets, values)
    elif targets:
        tf.__internal__.distribute.interim.maybe_merge_call(_assign, strategy, targets, values)


def _assign(distribution, targets, values):
    """Assigns each value to its (mirrored) variable on every local replica."""
    for variable, value in zip(targets, values):
        distribution.extended.update(variable, lambda v, x: v.assign(x), args=(value,),
                                     group=False)
