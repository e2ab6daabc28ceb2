"""`bench pipeline-processes --parts versus` (#50): its arithmetic and its part, no processes."""

from __future__ import annotations

import pytest

from tfdist.bench import pipeline_processes as pp
from tfdist.bench import timeline


def test_traced_ops_are_told_apart_by_kind():
    kind = timeline.op_kind
    assert kind("StatefulPartitionedCall/hidden_4_3/Relu/_49:_Send") == "send/recv"
    assert kind("StatefulPartitionedCall/hidden_5_1/Relu:_MklNativeFusedMatMul") == \
        "forward matmul"
    assert kind("StatefulPartitionedCall/gradient_tape/hidden_4_1/MatMul/MatMul:_MklMatMul") == \
        "backward matmul"
    assert kind("StatefulPartitionedCall/batched_weight_grads/MatMul:_MklMatMul") == \
        "batched weight grads"
    assert kind("StatefulPartitionedCall/batched_weight_grads_3/MatMul:_MklMatMul") == \
        "batched weight grads"
    assert kind("StatefulPartitionedCall/adam/truediv_26:RealDiv") == "update"
    assert kind("StatefulPartitionedCall/add_120:AddV2") == "adds"
    assert kind("StatefulPartitionedCall/split:Split") == "other"


def test_by_kind_sums_each_tasks_ops_over_whole_steps():
    ops = {0: [(0.0, 4.0, "a/x:MatMul"), (5.0, 6.0, "a/_1:_Send"), (10.0, 14.0, "a/x:MatMul"),
               (25.0, 30.0, "cut/x:MatMul")],
           1: [(2.0, 8.0, "gradient_tape/x:MatMul"), (12.0, 18.0, "gradient_tape/x:MatMul")]}
    steps = [(0.0, 10.0), (10.0, 20.0), (20.0, 40.0)]  # the last runs past the window's end
    kinds = timeline.by_kind(ops, steps)
    assert kinds[0]["ms_per_step"] == {"forward matmul": 4.0, "send/recv": 0.5}
    assert kinds[0]["busy"] == pytest.approx(9 / 20)
    assert kinds[1]["ms_per_step"] == {"backward matmul": 6.0}
    assert timeline.by_kind({}, steps) == {}


def test_versus_runs_every_alternative_alternated_and_checks_the_bars(monkeypatch):
    import argparse

    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    calls = []
    steps = {"single": 0.4, "single_1core": 0.64, "model_parallel": 0.5,
             "pipeline_1proc_m8": 0.45, "stages_m1": 0.62, "stages_m8": 0.42}

    def fake_run(argv, tasks, timeout_s, interval_s, **kw):
        calls.append((argv, tasks, kw))
        strategy = argv[argv.index("--strategy") + 1]
        if strategy == "pipeline":
            m = argv[argv.index("--microbatches") + 1]
            name = f"stages_m{m}" if tasks == 2 else f"pipeline_1proc_m{m}"
        elif strategy == "single":
            name = "single_1core" if "--threads" in argv else "single"
        else:
            name = strategy
        return {"median_step_s": steps[name], "load_avg_1m": 0.5, "final_loss": 1.0}

    monkeypatch.setattr(pp, "_run", fake_run)
    parser = argparse.ArgumentParser()
    pp.add_arguments(parser)
    args = parser.parse_args(["--parts", "versus", "--repeats", "2", "--versus-trace", "0"])
    result = pp.run(args)
    v = result["versus"]
    assert len(calls) == 2 * 6  # repeats x runs
    names = [n for n in v["points"]]
    assert names == ["single", "single_1core", "model_parallel", "pipeline_1proc_m8",
                     "stages_m1", "stages_m8"]
    # The second round runs them in the reverse order.
    assert calls[6][1] == 2 and calls[6][0][calls[6][0].index("--microbatches") + 1] == "8"
    staged = [(a, kw) for a, t, kw in calls if t == 2]
    assert all(kw["bind"] == "cores" and "--threads" in a and a[a.index("--devices") + 1] == "0"
               for a, kw in staged)
    one_core = next(kw for a, t, kw in calls if "--threads" in a and t == 1)
    assert one_core["share"] == "0/2"
    assert v["points"]["stages_m8"]["vs_single"] == pytest.approx(0.42 / 0.4)
    assert v["points"]["stages_m8"]["ideal_s"] == pytest.approx(0.64 * 9 / 16)
    assert v["checks"]["m8_vs_m1"] == pytest.approx(0.42 / 0.62)
    assert v["checks"]["stages_vs_single_met"] is False  # 1.05 > 0.8
    assert v["checks"]["pipeline_1proc_vs_model_parallel"] == pytest.approx(0.9)
    text = pp.table(result)
    assert "stages_m8" in text and "1.050" in text
    pp.plot(result, Figure())
