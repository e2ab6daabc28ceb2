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
round (`partition.rounds`, each rank's k-th largest variable), in row ranges
of at most `CHUNK_ELEMENTS` (`partition.row_chunks`), each replica flattens
its piece, pads it to the largest, and one `all_gather` brings every rank's;
the received rows are assigned the way Keras applies an update
(`extended.update`, through merge_call where the strategy needs it). In a
`tf.function` the collectives and assigns run in program order, so one
piece's buffers are alive at a time.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfdist.zero import partition
from tfdist.zero import pieces as pieces_lib

# Elements each rank puts in one all_gather (16 MB of float32): a round's big variables go
# in row ranges of this size, so one such piece per rank is alive at a time, not N variables.
CHUNK_ELEMENTS = 4 << 20


@dataclasses.dataclass(frozen=True)
class ReplicaGather:
    """Sets every variable to its owner's value (hashable: a sharded optimizer's class attribute)."""

    def __call__(self, variables, owners, rank):
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
    """Member q (rank q's variable, or None) reaches every rank, in all_gathers of at most
    `CHUNK_ELEMENTS` per rank: row ranges, each assigned as it arrives."""
    plans = [None if v is None else partition.row_chunks(tuple(v.shape), CHUNK_ELEMENTS)
             for v in members]
    for j in range(max(len(p) for p in plans if p is not None)):
        _gather_piece(strategy, ctx, [None if v is None or j >= len(p) else (v, p[j])
                                      for v, p in zip(members, plans)], rank)


def _gather_piece(strategy, ctx, pieces, rank: int) -> None:
    """One all_gather of each rank's piece (variable, rows or None), padded to the largest."""
    import tensorflow as tf

    flat, sizes, width = pieces_lib.padded(pieces, rank)
    if ctx is not None:
        gathered = ctx.all_gather(flat, axis=0)
    else:  # with accumulation, MirroredStrategy-like engines apply in cross-replica context
        gathered = strategy.gather(
            strategy.experimental_distribute_values_from_function(lambda _: flat), axis=0)
    arrived = pieces_lib.received(gathered, pieces, sizes, width, rank)
    targets = [(p[0].value, p[1]) for p, _ in arrived]
    values = [value for _, value in arrived]
    if targets and ctx is None:
        _assign(strategy, targets, values)
    elif targets:
        tf.__internal__.distribute.interim.maybe_merge_call(_assign, strategy, targets, values)


def _assign(distribution, targets, values):
    """Assigns each value to its (mirrored) variable's rows on every local replica."""
    for (variable, rows), value in zip(targets, values):
        if rows is None:
            fn = lambda v, x: v.assign(x)  # noqa: E731
        else:
            fn = lambda v, x, r=rows: v[r[0]:r[1]].assign(x)  # noqa: E731
        distribution.extended.update(variable, fn, args=(value,), group=False)
