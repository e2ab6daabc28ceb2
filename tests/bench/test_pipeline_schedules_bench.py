"""`bench pipeline-processes --parts schedules` (#42): its arithmetic and its part, no processes."""

import argparse

import pytest

from tfdist.bench import pipeline_processes as pp
from tfdist.bench import pipeline_schedules as ps


def test_predicted_step_against_1f1b_and_measured_bubble():
    # P = 2, M = 4: 1F1B idles 1/5 of a step, interleaved V = 2 1/9, ZB-H1 1/13.
    assert ps.predicted_ratio("1f1b", 2, 4, 2) == 1.0
    assert ps.predicted_ratio("interleaved", 2, 4, 2) == pytest.approx(0.8 / (8 / 9))
    assert ps.predicted_ratio("zb", 2, 4, 2) == pytest.approx(0.8 / (12 / 13))
    summary = {"tasks": {0: {"median_step_busy": 0.9}, 1: {"median_step_busy": 0.7}}}
    assert ps.measured_bubble(summary) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="no whole step"):
        ps.measured_bubble({"tasks": {0: {"median_step_busy": None}}})


def test_the_part_alternates_the_schedules_and_judges_each_against_1f1b(monkeypatch):
    parser = argparse.ArgumentParser()
    pp.add_arguments(parser)
    args = parser.parse_args(["--parts", "schedules", "--repeats", "2"])
    calls = []
    step = {"1f1b": 0.5, "interleaved": 0.48, "zb": 0.4}  # zb saves enough, interleaved not

    def run_job(argv, tasks, *_, env=None, **__):
        name = argv[argv.index("--schedule") + 1]
        calls.append((name, tasks))
        assert env["TFDIST_BENCH_TRACE"].startswith("5,2000,")  # traced after the warm-up
        if name == "interleaved":
            assert argv[argv.index("--virtual-stages") + 1] == "2"
        return {"median_step_s": step[name], "load_avg_1m": 0.0, "final_loss": 1.0,
                "processes": [{"cpu_share": 0.9, "train_peak_bytes": 2**30}] * tasks}

    busy = {"1f1b": 0.8, "interleaved": 0.9, "zb": 0.95}

    def trace(logdir):
        b = busy[calls[-1][0]]  # the run just traced
        return {"median_step_ms": 100.0, "tasks": {0: {"median_step_busy": b},
                                                   1: {"median_step_busy": b}}}

    planned = {"predictions": {n: {"step_s": 0.5, "bubble": 0.1, "peak_bytes": [2**20] * 2}
                               for n in step}}
    result = ps.measure(args, run_job, planned, trace)
    assert [n for n, t in calls] == ["1f1b", "interleaved", "zb", "zb", "interleaved",
                                     "1f1b"]
    got = result["schedules"]
    assert got["zb"]["saves_half"] and not got["interleaved"]["saves_half"]
    assert got["zb"]["bubble"] == pytest.approx(0.05)
    assert got["1f1b"]["bubble"] == pytest.approx(0.2)
    assert got["zb"]["bubble_below_1f1b"] and got["interleaved"]["bubble_below_1f1b"]
    assert got["zb"]["planner_vs_measured"] == pytest.approx(0.5 / 0.4)
    assert got["zb"]["planner_peak_vs_rss"] == [pytest.approx(2**-10)] * 2
    # Unless given, the planner runs before each repeat, each judged against its repeat.
    plans = iter([0.2, 0.8])
    monkeypatch.setattr(ps, "plan", lambda _: {"predictions": {
        n: {"step_s": next(plans) if n == "zb" else 0.5, "bubble": 0.1,
            "peak_bytes": [2**20] * 2} for n in step}})
    again = ps.measure(args, run_job, None, trace)
    assert len(again["plans"]) == 2
    assert [x["planner_step_s"] for x in again["schedules"]["zb"]["runs"]] == [0.2, 0.8]
    assert again["schedules"]["zb"]["planner_vs_measured"] == pytest.approx(1.25)
    assert "predicted / 1f1b" in pp.table({"schedules": result})
    with pytest.raises(ValueError, match="must start with 1f1b"):
        ps.measure(parser.parse_args(["--schedules", "zb,1f1b"]), run_job, planned, trace)
