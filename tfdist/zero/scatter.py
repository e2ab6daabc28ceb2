"""Each worker receives the summed gradients of the variables it owns (multi_worker).

In place of the full all-reduce: with the weights' all_gather after the
owners' update (`tfdist.zero.mwms`), a reduce-scatter makes the step's
traffic about one all-reduce's, where an all-reduce and then the all_gather
send half as much again. MultiWorkerMirrored has no reduce-scatter on CPU, so
an all-to-all stands in (`tfdist.compat.tf_all_to_all`): in the rounds of the
gather (`partition.rounds`) and row ranges (`partition.row_chunks`) of at most
`SCATTER_CHUNK_ELEMENTS` per rank, each worker sends every rank the rows of
its local gradient of the variable that rank owns, and sums the n copies of
its own that arrive.

What the gradients are afterwards: an owned dense gradient is the sum over
workers (as the all-reduce gave); a dense gradient another worker owns stays
this worker's local one (it feeds only the accumulators, which the update
step of an unowned variable never reads, and the finite check, which a local
inf or NaN fails as the sum would); sparse gradients (IndexedSlices) are
all-reduced as before, so every worker holds them whole and the repeated-row
rule is untouched. Global-norm clipping then adds the owners' partial squared
norms (`partial_norm`), and a mixed-precision skip is agreed by every worker.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfdist.zero import partition

# Elements each rank sends one owner in one all-to-all (4 MB of float32; at most
# `mwms.CHUNK_ELEMENTS`). The scatter runs while every local gradient is alive (the
# step's peak): a piece's copy and what arrives, n pieces each, come on top. With
# the gather's 16 MB pieces a 4-worker step of 4 x 4096x4096 + Adam peaked at
# 480-590 MiB of TensorFlow's allocator over the weights and owned state, with these
# 360-430 (docs/benchmarks.md), for four times as many all-to-alls.
SCATTER_CHUNK_ELEMENTS = 1 << 20


@dataclasses.dataclass(frozen=True)
class ReplicaScatter:
    """Sums each dense gradient onto its owner (hashable: a sharded optimizer's attribute)."""

    def __call__(self, grads, owners, rank):
        """The gradients with each owned dense one summed over workers (see the module).

        Args:
            grads: This worker's gradients, one per trainable variable (or None).
            owners: Each variable's rank.
            rank: This worker's rank.
        """
        import tensorflow as tf

        from tfdist.compat import tf_all_to_all

        ctx = tf.distribute.get_replica_context()
        n = ctx.num_replicas_in_sync
        out = list(grads)
        sparse = [i for i, g in enumerate(grads) if isinstance(g, tf.IndexedSlices)]
        if sparse:
            for i, g in zip(sparse, ctx.all_reduce(tf.distribute.ReduceOp.SUM,
                                                   [grads[i] for i in sparse])):
                out[i] = g
        dense = [i for i, g in enumerate(grads) if g is not None and i not in set(sparse)]
        by_dtype: dict = {}
        for i in dense:
            by_dtype.setdefault(np.dtype(grads[i].dtype.as_numpy_dtype), []).append(i)
        last = None  # one piece's copies alive at a time, round after round
        for index in by_dtype.values():
            sizes = [grads[i].shape.num_elements() for i in index]
            for members in partition.rounds(sizes, [owners[i] for i in index], n):
                members = [None if m is None else index[m] for m in members]
                summed, last = _scatter_round(
                    tf_all_to_all.all_to_all, [None if m is None else grads[m] for m in members],
                    rank, last)
                if summed is not None:
                    out[members[rank]] = summed
        return out


def _scatter_round(all_to_all, members, rank: int, after=None):
    """Member q (the local gradient of rank q's variable, or None) summed onto rank q, in
    all-to-alls of at most `SCATTER_CHUNK_ELEMENTS` (and `mwms.CHUNK_ELEMENTS`) per rank,
    each piece's copies made after `after` (the previous all-to-all's result) arrived;
    returns (this rank's sum or None, the last result)."""
    import tensorflow as tf

    from tfdist.zero import mwms

    chunk = min(SCATTER_CHUNK_ELEMENTS, mwms.CHUNK_ELEMENTS)
    plans = [None if g is None else partition.row_chunks(tuple(g.shape), chunk)
             for g in members]
    mine, received = [], after
    for j in range(max(len(p) for p in plans if p is not None)):
        pieces = [None if g is None or j >= len(p) else
                  (g if p[j] is None else g[p[j][0]:p[j][1]])
                  for g, p in zip(members, plans)]
        sizes = [0 if p is None else p.shape.num_elements() for p in pieces]
        width = max(sizes)
        dtype = next(p for p in pieces if p is not None).dtype
        # Built once the previous piece has arrived: nothing else orders these copies of
        # the gradients, and TensorFlow would otherwise make every piece's at once.
        # One copy: the rows and their padding concatenated, then viewed as [n, width].
        with tf.control_dependencies([] if received is None else [received]):
            parts = []
            for p, s in zip(pieces, sizes):
                parts += ([] if p is None else [tf.reshape(p, [-1])]) + (
                    [tf.zeros([width - s], dtype)] if s < width else [])
            sent = tf.reshape(tf.concat(parts, 0), [len(pieces), width])
        received = all_to_all(sent)  # row p: rank p's rows of my variable's piece
        if pieces[rank] is not None:
            total = tf.reduce_sum(received, axis=0)[:sizes[rank]]
            mine.append(tf.reshape(total, pieces[rank].shape))
    if members[rank] is None:
        return None, received
    return (mine[0] if len(mine) == 1 else tf.concat(mine, axis=0)), received


def partial_norm(grads, owners, rank: int):
    """Keras's squared global norm of the gradients this worker owns (dense: summed here;
    sparse: whole everywhere, so counted by its owner only); 0.0 when it owns none."""
    from keras import ops

    squared = [ops.sum(ops.square(g)) for g, o in zip(grads, owners)
               if g is not None and o == rank]
    return ops.sum(ops.stack(squared)) if squared else ops.convert_to_tensor(0.0)
