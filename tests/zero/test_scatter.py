"""The reduce-scatter's pieces (`tfdist.zero.scatter._scatter_round`) on simulated ranks.

Each rank's all-to-all is played in one process: a first pass records what
every rank sends, a second hands each rank row `rank` of everyone's. Owned
gradients must come back summed over ranks whatever their shapes, padding and
row ranges.
"""

import numpy as np
import pytest

from tfdist.zero import mwms, scatter


def _exchange(members_by_rank, n):
    """Each rank's `_scatter_round` result, the all-to-all played between the ranks."""
    sent = {}

    def recorder(rank):
        def all_to_all(x):
            sent.setdefault(rank, []).append(x)
            return x
        return all_to_all

    for r in range(n):
        scatter._scatter_round(recorder(r), members_by_rank[r], r)  # records only

    def exchanged(rank):
        count = iter(range(len(sent[rank])))

        def all_to_all(x):
            import tensorflow as tf

            j = next(count)
            return tf.stack([sent[p][j][rank] for p in range(n)])
        return all_to_all

    return [scatter._scatter_round(exchanged(r), members_by_rank[r], r)[0] for r in range(n)]


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

    scatter._scatter_round(recorder, [tf.constant(g) for g in local[0]], 0)
    assert widths == [4, 4, 2]
    got = _exchange([[tf.constant(g) for g in row] for row in local], n)
    for q in range(n):
        np.testing.assert_allclose(got[q].numpy(), local[0][q] + local[1][q], rtol=1e-6)


def test_partial_norm_counts_each_gradient_on_its_owner_only():
    grads = [np.full((2,), 3.0, np.float32), None, np.full((1,), 4.0, np.float32)]
    assert float(scatter.partial_norm(grads, [0, 0, 1], 0)) == pytest.approx(18.0)
    assert float(scatter.partial_norm(grads, [0, 0, 1], 1)) == pytest.approx(16.0)
    assert float(scatter.partial_norm(grads, [0, 0, 0], 2)) == 0.0
