"""The reduce-scatter's pieces (`tfdist.zero.scatter._scatter_round`) on simulated ranks.

Each rank's all-to-all is played in one process: a first pass records what
every rank sends, a second hands each rank row `rank` of everyone's. Owned
gradients must come back summed over ranks whatever their shapes, padding and
row ranges.
"""

import numpy as np
import pytest

from tfdist.zero import mwms, scatter


class _Engine:
    """An engine whose reduce-scatter is `all_to_all` then a sum (as multi_worker's)."""

    def __init__(self, all_to_all):
        self.all_to_all = all_to_all

    def rows(self, sent, name):
        import tensorflow as tf

        return tf.reduce_sum(self.all_to_all(sent), axis=0)


def _exchange(members_by_rank, n):
    """Each rank's `_scatter_round` result, the all-to-all played between the ranks."""
    sent = {}

    def recorder(rank):
        def all_to_all(x):
            sent.setdefault(rank, []).append(x)
            return x
        return all_to_all

    for r in range(n):
        scatter._scatter_round(_Engine(recorder(r)), members_by_rank[r], r)  # records only

    def exchanged(rank):
        count = iter(range(len(sent[rank])))

        def all_to_all(x):
            import tensorflow as tf

            j = next(count)
            return tf.stack([sent[p][j][rank] for p in range(n)])
        return all_to_all

    return [scatter._scatter_round(_Engine(exchanged(r)), members_by_rank[r], r)[0]
            for r in range(n)]


@pytest.mark.parametrize("chunk", [4 << 20, 5])
def test_each_owner_gets_the_sum_of_its_variable(monkeypatch, chunk):
    import tensorflow as tf

    monkeypatch.setattr(mwms, "CHUNK_ELEMENTS", chunk)  # 5: row ranges, uneven last one
    n = 3
    shapes = [(7, 2), (3,), None]  # rank 2 owns nothing this round
    rng = np.random.default_rng(0)
    local = [[None if s is None else rng.standard_normal(s).astype(np.float32) for s in shapes]
             for _ in range(n)]
    members = [[None if g is None else tf.constant(g) for g in row] for row in local]
    got = _exchange(members, n)
    for q in range(n):
        if shapes[q] is None:
            assert got[q] is None
        else:
            want = sum(local[r][q] for r in range(n))
            np.testing.assert_allclose(got[q].numpy(), want, rtol=1e-6)


def test_the_scatter_sends_pieces_of_at_most_its_own_chunk(monkeypatch):
    """SCATTER_CHUNK_ELEMENTS, below the gather's CHUNK_ELEMENTS, bounds each all-to-all."""
    import tensorflow as tf

    monkeypatch.setattr(mwms, "CHUNK_ELEMENTS", 4 << 20)
    monkeypatch.setattr(scatter, "SCATTER_CHUNK_ELEMENTS", 4)  # 2 rows of (., 2) a piece
    n = 2
    rng = np.random.default_rng(1)
    local = [[rng.standard_normal((5, 2)).astype(np.float32) for _ in range(n)]
             for _ in range(n)]
    widths = []

    def recorder(x):
        widths.append(int(x.shape[1]))
        return x

    scatter._scatter_round(_Engine(recorder), [tf.constant(g) for g in local[0]], 0)
    assert widths == [4, 4, 2]
    got = _exchange([[tf.constant(g) for g in row] for row in local], n)
    for q in range(n):
        np.testing.assert_allclose(got[q].numpy(), local[0][q] + local[1][q], rtol=1e-6)


def test_partial_norm_counts_each_gradient_on_its_owner_only():
    grads = [np.full((2,), 3.0, np.float32), None, np.full((1,), 4.0, np.float32)]
    assert float(scatter.partial_norm(grads, [0, 0, 1], 0)) == pytest.approx(18.0)
    assert float(scatter.partial_norm(grads, [0, 0, 1], 1)) == pytest.approx(16.0)
    assert float(scatter.partial_norm(grads, [0, 0, 0], 2)) == 0.0


class _Played:
    """`owned_sums`' engine on simulated ranks: with `sent` None it records what this
    rank sends; given every rank's record, it hands this rank its row of each piece
    reduced over the ranks (summed or averaged)."""

    densify_sparse = False

    def __init__(self, rank, n, mean, sent=None):
        self.rank, self.n, self.mean, self.sent = rank, n, mean, sent
        self.record, self.kept = [], []

    def rows(self, x, name):
        import tensorflow as tf

        self.record.append(x)
        if self.sent is None:
            return x[self.rank]
        total = tf.add_n([self.sent[p][len(self.record) - 1][self.rank] for p in range(self.n)])
        return total / self.n if self.mean else total

    def sparse(self, grads):
        return list(grads)  # whole everywhere (the test's sparse gradient is equal)

    def keep(self, tensors):
        self.kept.append(len(tensors))


@pytest.mark.parametrize("mean", [False, True])
def test_owned_sums_give_each_owner_its_reduction_and_nothing_else(mean):
    import tensorflow as tf

    n = 2
    rng = np.random.default_rng(2)
    shapes = [(6, 3), (4,), (5, 2)]
    owners = [0, 1, 1]
    local = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(n)]
    slices = tf.IndexedSlices(tf.ones([2, 3]), tf.constant([1, 1]), tf.constant([9, 3]))
    sent = {}
    for r in range(n):  # recording pass
        engine = _Played(r, n, mean)
        scatter.owned_sums(engine, [tf.constant(g) for g in local[r]], owners, r, n)
        sent[r] = engine.record
    for r in range(n):
        engine = _Played(r, n, mean, sent)
        grads = [tf.constant(g) for g in local[r]] + [slices, None]
        got, last = scatter.owned_sums(engine, grads, owners + [0, 1], r, n)
        assert last is not None
        for i, o in enumerate(owners):
            if o != r:
                assert got[i] is None
                continue
            want = sum(local[p][i] for p in range(n)) / (n if mean else 1)
            np.testing.assert_allclose(got[i].numpy(), want, rtol=1e-6)
        assert (got[3] is slices) == (r == 0) and got[4] is None  # sparse: its owner's only
        if r == 1:  # the sparse gradient it does not keep is read by a stateful op
            assert engine.kept == [2]
