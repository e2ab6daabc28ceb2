"""Pure parsing and arithmetic of `bench pipeline-processes --parts chief` (no processes)."""

import pytest

from tfdist.bench import chief_peak
from tfdist.model_parallel import memory_plan

MIB = 2 ** 20


def test_stage_shares_read_the_chief_memory_table():
    rows = [("task:0", 193 * MIB, 386 * MIB, 193 * MIB, 4 * MIB, 1),
            ("task:1", 192 * MIB, 384 * MIB, 192 * MIB, 3 * 1024, 2)]
    out = "\n".join(f"[worker 0] {line}" for line in memory_plan.format_rows(rows).splitlines())
    shares = chief_peak.stage_shares("[worker 0] tfdist: memory each process holds\n" + out
                                     + "\n[worker 0] task:3 something else")
    assert sorted(shares) == [0, 1]
    assert shares[0] == {"weights": 193 * MIB, "optimizer": 386 * MIB,
                         "gradients": 193 * MIB, "step_peak": 776 * MIB}
    # 3 KiB x 2 in flight: printed to a tenth of a MiB.
    assert shares[1]["step_peak"] == pytest.approx(768 * MIB + 6 * 1024, abs=0.05 * MIB)


def test_the_chief_is_allowed_what_the_serving_stages_hold_beyond_their_share():
    base = 600
    shares = {0: 800, 1: 790, 2: 790}
    peaks = {0: 1500, 1: 1490, 2: 1470}  # excess 100, 100, 80
    v = chief_peak.verdict(peaks, shares, base)
    assert v["excess"] == {0: 100, 1: 100, 2: 80}
    assert v["allowance_bytes"] == 100 and v["bound_bytes"] == 1500
    assert v["met"] and v["chief_over_bound_bytes"] == 0
    v = chief_peak.verdict({**peaks, 0: 1501}, shares, base)
    assert not v["met"] and v["chief_over_bound_bytes"] == 1
    # Stages under share + baseline: no allowance below zero; one process alone: none.
    assert chief_peak.verdict({0: 1300, 1: 1300}, shares, base)["allowance_bytes"] == 0
    assert chief_peak.verdict({0: 1300}, {0: 800}, base)["bound_bytes"] == 1400
    with pytest.raises(ValueError, match="chief"):
        chief_peak.verdict({1: 1}, {1: 1}, base)
