"""tfdist.bench.timeline's arithmetic (pure): busy time, idle gaps, the trace spec."""

import pytest

from tfdist.bench import timeline


def test_the_trace_spec_is_step_ms_dir_or_refused_naming_what_came():
    assert timeline.parse_spec("5,2000,/tmp/a,b") == (5, 2000, "/tmp/a,b")
    for bad in ("5,2000", "x,2000,/d", "5,0,/d", "-1,10,/d", ""):
        with pytest.raises(ValueError, match="STEP,MS,DIR"):
            timeline.parse_spec(bad)


def test_busy_merges_overlapping_ops_and_lists_gaps_with_the_ops_either_side():
    ops = [(0.0, 2.0, "a"), (1.0, 3.0, "b"), (5.0, 6.0, "c"), (6.5, 7.0, "d")]
    total, gaps = timeline.busy(ops, 0.0, 10.0, gap_ms=1.0)
    assert total == pytest.approx(3.0 + 1.0 + 0.5)
    # 3 -> 5 between b and c; 7 -> 10 at the end; 6 -> 6.5 is under 1 ms.
    assert gaps == [(3.0, 2.0, "b", "c"), (7.0, 3.0, "d", "end")]


def test_busy_counts_only_ops_starting_in_the_window_and_cuts_them_at_its_end():
    ops = [(-1.0, 0.5, "before"), (2.0, 4.0, "a"), (9.0, 12.0, "late"), (12.0, 13.0, "after")]
    total, gaps = timeline.busy(ops, 0.0, 10.0, gap_ms=1.0)
    assert total == pytest.approx(2.0 + 1.0)
    assert gaps[0] == (0.0, 2.0, "start", "a")
    assert gaps[1] == (4.0, 5.0, "a", "late")


def test_summarize_takes_whole_steps_inside_the_window_and_the_median_steps_gaps():
    ops = {0: [(0.0, 4.0, "f0"), (6.0, 10.0, "b0"), (10.0, 14.0, "f1"), (16.0, 20.0, "b1")],
           1: [(4.5, 6.0, "f1_0"), (14.5, 16.0, "f1_1")]}
    steps = [(-5.0, 0.0), (0.0, 10.0), (10.0, 20.0), (20.0, 25.0)]  # first and last cut
    out = timeline.summarize(ops, steps, gap_ms=1.0)
    assert out["window_ms"] == 20.0 and out["steps"] == [10.0, 10.0]
    assert out["tasks"][0]["step_busy"] == [0.8, 0.8]
    assert out["tasks"][1]["step_busy"] == [0.15, 0.15]
    assert out["tasks"][1]["median_step_busy"] == 0.15
    assert out["tasks"][0]["window_busy"] == pytest.approx(16.0 / 20.0)
    # Task 1's gaps in the median (first) step, longest first: before its op, then after.
    assert out["tasks"][1]["median_step_gaps"] == [(0.0, 4.5, "start", "f1_0"),
                                                   (6.0, 4.0, "f1_0", "end")]
    assert timeline.summarize({}, steps)["tasks"] == {}
