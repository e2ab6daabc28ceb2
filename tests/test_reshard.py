"""Backups resumed under another tensor-parallel degree: the pure plan (tfdist.reshard)."""

import numpy as np
import pytest

from tfdist import reshard
from tfdist.errors import CheckpointError


def _sig(name, full, parts, axis=1):
    """A signature of `name` ([4, full]) cut into `parts` shards on `axis` (1: none)."""
    if parts == 1:
        return [[name, [4, full], "float32"]]
    bounds = np.linspace(0, full, parts + 1).astype(int)
    return [[f"{name}_{k}", [4, int(b - a)], "float32", [name, axis, int(a), int(b), [4, full]]]
            for k, (a, b) in enumerate(zip(bounds, bounds[1:]))]


@pytest.mark.parametrize("before,after", [(2, 3), (3, 2), (2, 1), (1, 3), (2, 2)])
def test_any_degree_resumes_at_any_other(before, after):
    full = np.arange(4 * 6, dtype="float32").reshape(4, 6)
    got, want = _sig("d/kernel", 6, before), _sig("d/kernel", 6, after)
    stored = {}
    for i, entry in enumerate(got):
        a, b = (entry[3][2], entry[3][3]) if len(entry) > 3 else (0, 6)
        stored[i] = full[:, a:b]
    steps = reshard.plan(reshard.model_pieces(got), reshard.model_pieces(want), "model", "p")
    out = [stored[s] if isinstance(s, int) else reshard.assemble(s, stored.__getitem__)
           for s in steps]
    np.testing.assert_array_equal(np.concatenate(out, axis=1), full)
    if before == after:
        assert steps == list(range(before))  # the same layout reads its own entries


def test_slots_follow_the_slices_of_their_variables():
    model = _sig("d/kernel", 6, 2)
    opt = [["adam/iteration", [], "int64"], ["adam/d_kernel_0_momentum", [4, 3], "float32"],
           ["adam/d_kernel_1_momentum", [4, 3], "float32"]]
    pieces = reshard.optimizer_pieces(opt, model)
    assert pieces[0] == reshard.Piece("iteration", None, 0, 0, ())
    assert pieces[2] == reshard.Piece("d_kernel_momentum", 1, 3, 6, (4, 6))


def test_a_missing_weight_or_a_gap_in_the_shards_is_named():
    want = reshard.model_pieces(_sig("d/kernel", 6, 1))
    with pytest.raises(CheckpointError, match="holds no model variable 'd/kernel'"):
        reshard.plan(reshard.model_pieces(_sig("e/kernel", 6, 2)), want, "model", "p")
    gap = reshard.model_pieces(_sig("d/kernel", 6, 3))[::2]  # the middle shard lost
    with pytest.raises(CheckpointError, match="do not make its shape"):
        reshard.plan(gap, want, "model", "p")
