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
class LauncherScatter:
    """multi_worker's collectives for `owned_sums`, through the strategy's own launcher
    (`tfdist.compat.tf_all_to_all`), so they run in replica and in cross-replica
    context alike (one replica per worker). Sums: the loss is already divided by
    the replicas. Hashable: a sharded optimizer's class attribute."""

    densify_sparse = False

    def rows(self, sent, name: str):
        """This rank's row of `sent` ([n, width]) summed over workers."""
        import tensorflow as tf

        from tfdist.compat import tf_all_to_all

        return tf.reduce_sum(tf_all_to_all.all_to_all(sent), axis=0)

    def sparse(self, grads: list) -> list:
        """IndexedSlices summed over workers (their slices gathered)."""
        from tfdist.compat import tf_all_to_all

        return [tf_all_to_all.all_reduce_indexed_slices(g) for g in grads]

    def all_sum(self, x):
        from tfdist.compat import tf_all_to_all

        return tf_all_to_all.all_reduce_sum(x)

    def all_gather(self, part, name: str):
        """Every worker's flat `part` (one size everywhere), concatenated in worker order
        (`--shard parameters`, `tfdist.zero.parameters`)."""
        from tfdist.compat import tf_all_to_all

        return tf_all_to_all.all_gather(part)

    def reduce_rows(self, flat, rank: int, n: int, name: str):
        """This worker's n-th of the flat `flat` (n equal parts) summed over the workers, in
        all-to-alls of at most `SCATTER_CHUNK_ELEMENTS` per rank: measured on 2 workers,
        one 64 MB all-to-all took 172 ms and 16 of 4 MB 84-101 ms, and each holds one
        chunk's copies rather than the whole gradient's."""
        import tensorflow as tf

        from tfdist.zero import mwms

        sent = tf.reshape(flat, [n, -1])
        chunks = partition.column_chunks(int(sent.shape[1]),
                                         min(SCATTER_CHUNK_ELEMENTS, mwms.CHUNK_ELEMENTS))
        return tf.concat([self.rows(sent[:, a:b], f"{name}_{a}") for a, b in chunks], 0)


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

        ctx = tf.distribute.get_replica_context()
        out = list(grads)
        sparse = [i for i, g in enumerate(grads) if isinstance(g, tf.IndexedSlices)]
        if sparse:
            for i, g in zip(sparse, ctx.all_reduce(tf.distribute.ReduceOp.SUM,
                                                   [grads[i] for i in sparse])):
                out[i] = g
        taken = set(sparse)
        dense = [None if i in taken else g for i, g in enumerate(grads)]
        summed, _ = owned_sums(LauncherScatter(), dense, owners, rank,
                               ctx.num_replicas_in_sync)
        return [s if s is not None else g for s, g in zip(summed, out)]


def owned_sums(engine, grads, owners, rank: int, n: int, after=None) -> tuple[list, object]:
    """Each gradient this rank owns reduced over the workers; None for the others.

    Dense gradients are reduce-scattered in the rounds of the weights' gather
    (`partition.rounds`) and row ranges of at most `SCATTER_CHUNK_ELEMENTS`
    per rank (see the module); sparse ones (IndexedSlices) go through the
    engine's sparse all-reduce (every worker gets them whole, the repeated-row
    rule untouched) and are kept by their owner only, or are made dense and
    scattered where the engine has no sparse reduction (`densify_sparse`).

    Args:
        engine: The engine's collectives, each summing or averaging as its losses
            need: `rows(sent, name)` (this rank's row of `sent`, [n, width],
            reduced) or `parts(pieces, rank, name)` (this rank's piece of the flat
            `pieces`, one per rank or None, reduced); `densify_sparse`, else
            `sparse(grads)`; and optionally `keep(tensors)` (a stateful op reading
            them: Horovod prunes an unused collective while its peers wait).
        grads: This worker's gradients, one per trainable variable (or None).
        owners: Each variable's rank.
        rank: This worker's rank.
        n: Workers.
        after: A tensor the first collective waits for (or None).

    Returns:
        (one entry per gradient: the reduced gradient where `owners` names this
        rank and the gradient is not None, else None; the last collective's
        result, or `after` when there was none): a collective that must come
        after these on every rank waits for the second, as nothing else orders
        a rank's next collective after ones whose results it does not use.
    """
    import tensorflow as tf

    out = [None] * len(grads)
    unused = []  # collectives' results this rank does not keep (see `keep`)
    grads = list(grads)
    sparse = [i for i, g in enumerate(grads) if isinstance(g, tf.IndexedSlices)]
    if sparse and engine.densify_sparse:
        for i in sparse:
            grads[i] = tf.convert_to_tensor(grads[i])
    elif sparse:
        with tf.control_dependencies([] if after is None else [after]):
            reduced = engine.sparse([grads[i] for i in sparse])
        for i, g in zip(sparse, reduced):
            if owners[i] == rank:
                out[i] = g
            else:
                unused += [g.values, g.indices]
        after = reduced[-1].values
    taken = set() if engine.densify_sparse else set(sparse)
    dense = [i for i, g in enumerate(grads) if g is not None and i not in taken]
    by_dtype: dict = {}
    for i in dense:
        by_dtype.setdefault(np.dtype(grads[i].dtype.as_numpy_dtype), []).append(i)
    last, count = after, 0  # one piece's copies alive at a time, round after round
    for index in by_dtype.values():
        sizes = [grads[i].shape.num_elements() for i in index]
        for members in partition.rounds(sizes, [owners[i] for i in index], n):
            members = [None if m is None else index[m] for m in members]
            summed, last, count, spare = _scatter_round(
                engine, [None if m is None else grads[m] for m in members], rank, last, count)
            unused += spare
            if summed is not None:
                out[members[rank]] = summed
    if unused and hasattr(engine, "keep"):
        engine.keep(unused)
    return out, last


def _scatter_round(engine, members, rank: int, after=None, count: int = 0):
    """Member q (the local gradient of rank q's variable, or None) reduced onto rank q, in
    reduce-scatters of at most `SCATTER_CHUNK_ELEMENTS` (and `mwms.CHUNK_ELEMENTS`) per
    rank, each piece's copies made after `after` (the previous piece's result) arrived;
    returns (this rank's sum or None, the last result, the pieces so far, the results of
    pieces this rank holds none of)."""
    import tensorflow as tf

    from tfdist.zero import mwms

    chunk = min(SCATTER_CHUNK_ELEMENTS, mwms.CHUNK_ELEMENTS)
    plans = [None if g is None else partition.row_chunks(tuple(g.shape), chunk)
             for g in members]
    mine, received, spare = [], after, []
    for j in range(max(len(p) for p in plans if p is not None)):
        pieces = [None if g is None or j >= len(p) else
                  (g if p[j] is None else g[p[j][0]:p[j][1]])
                  for g, p in zip(members, plans)]
        sizes = [0 if p is None else p.shape.num_elements() for p in pieces]
        width = max(sizes)
        dtype = next(p for p in pieces if p is not None).dtype
        # Built once the previous piece has arrived: nothing else orders these copies of
        # the gradients, and TensorFlow would otherwise make every piece's at once.
        with tf.control_dependencies([] if received is None else [received]):
            name = f"tfdist_zero_scatter_{count}"
            if hasattr(engine, "parts"):  # reads the pieces in place: no copy, no padding
                received = engine.parts([None if p is None else tf.reshape(p, [-1])
                                         for p in pieces], rank, name)
            else:  # one copy: the rows and their padding concatenated, viewed as [n, width]
                parts = []
                for p, s in zip(pieces, sizes):
                    parts += ([] if p is None else [tf.reshape(p, [-1])]) + (
                        [tf.zeros([width - s], dtype)] if s < width else [])
                sent = tf.reshape(tf.concat(parts, 0), [len(pieces), width])
                received = engine.rows(sent, name)  # my row, reduced
        count += 1
        if pieces[rank] is not None:
            mine.append(tf.reshape(received[:sizes[rank]], pieces[rank].shape))
        else:
            spare.append(received)
    if members[rank] is None:
        return None, received, count, spare
    return (mine[0] if len(mine) == 1 else tf.concat(mine, axis=0)), received, count, spare


def partial_norm(grads, owners, rank: int):
    """Keras's squared global norm of the gradients this worker owns (dense: summed here;
    sparse: whole everywhere, so counted by its owner only); 0.0 when it owns none."""
    from tfdist import gradient_path

    return gradient_path.squared_sum([g for g, o in zip(grads, owners) if o == rank])


def clip_by_global_norm(grads, owners, rank: int, clip_norm: float, all_sum) -> list:
    """Keras's clip_by_global_norm of the owned gradients, the norm summed over every
    worker's part (`all_sum`: a scalar summed over the workers, called on every worker
    even when it owns none), after the repeated sparse rows are summed as Keras's own
    (patched) clipping does; the gradients of other owners are left as they are."""
    from tfdist import gradient_path
    from tfdist.compat import keras_sparse_duplicates

    if keras_sparse_duplicates.is_applied():
        grads = [keras_sparse_duplicates.deduplicate(g) for g in grads]
    mine = [o == rank for o in owners]
    return gradient_path.clip_by_global_norm(grads, clip_norm, counted=mine, scaled=mine,
                                             total=all_sum)


def tensors_of(grads) -> list:
    """The tensors of a gradient list (an IndexedSlices' values and indices)."""
    out = []
    for g in grads:
        if g is not None:
            out += [g.values, g.indices] if hasattr(g, "indices") else [g]
    return out
