"""Pure parsing and arithmetic of `bench pipeline-processes --parts chief` (no processes)."""

import pytest

from tfdist.bench import chief_peak
from tfdist.model_parallel.planning import memory_plan

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


def test_each_task_may_have_its_own_baseline():
    shares = {0: 800, 1: 790, 2: 790}
    peaks = {0: 1560, 1: 1490, 2: 1470}
    # The chief's role costs 60 more than a serving stage's whatever the model's size.
    v = chief_peak.verdict(peaks, shares, {0: 660, 1: 600, 2: 600})
    assert v["excess"] == {0: 100, 1: 100, 2: 80}
    assert v["met"] and v["bound_bytes"] == 1560
    assert not chief_peak.verdict({**peaks, 0: 1561}, shares, {0: 660, 1: 600, 2: 600})["met"]
    with pytest.raises(ValueError, match="baseline"):
        chief_peak.verdict(peaks, shares, {1: 600, 2: 600})


def test_the_baseline_model_is_the_same_command_with_narrow_layers():
    model = "model_parallel_mlp --hidden-layers 13 --hidden-units 4096 --optimizer adam"
    assert chief_peak.narrowed(model, 8) == (
        "model_parallel_mlp --hidden-layers 13 --hidden-units 8 --optimizer adam")
    assert chief_peak.narrowed("r --hidden-units=4096 --seed 0", 8) == "r --hidden-units=8 --seed 0"
    with pytest.raises(ValueError, match="received 'digits_mlp --seed 0'.*--chief-baseline-units 0"):
        chief_peak.narrowed("digits_mlp --seed 0", 8)


def test_a_task_peak_is_its_median_whole_run_peak_over_the_repeats():
    def run(first, resumed):
        return {"first": {"peak_bytes": {"0": first, "1": first - 5}},
                "resumed": {"peak_bytes": {"0": resumed, "1": resumed - 5}}}

    # Whole-run peak = the larger job; the median of 3 (an outlier run ignored).
    runs = [run(100, 120), run(130, 110), run(100, 400)]
    assert chief_peak.median_peaks(runs) == {0: 130, 1: 125}
    assert chief_peak.median_peaks(runs[:2]) == {0: 130, 1: 125}  # the upper of two
