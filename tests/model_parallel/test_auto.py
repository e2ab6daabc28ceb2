"""`--schedule auto` and `--balance time`: the arithmetic around the planner (pure)."""

from tfdist.model_parallel.planning import auto, planner
from tfdist.strategies.options import StrategyOptions


def test_the_planner_runs_only_when_asked_for():
    assert not auto.needed(StrategyOptions(schedule="1f1b"))
    assert auto.needed(StrategyOptions(schedule="auto"))
    assert auto.needed(StrategyOptions(schedule="zb", balance="time"))


def test_node_costs_are_each_calls_forward_and_backward_in_nanoseconds():
    layers = [planner.LayerCost(1e-3, 2e-3, 3e-3, 0, 0), planner.LayerCost(0.0, 0.0, 0.0, 0, 0)]
    assert auto.node_costs(layers) == [6_000_000, 1]  # a call never weighs nothing


def test_one_process_holding_every_stage_holds_one_baseline():
    predictions = {"1f1b": {"peak_bytes": [100 + 5, 100 + 7], "step_s": 1.0}}
    assert auto.process_peaks(predictions, 2, baseline=100)["1f1b"]["peak_bytes"] == [112]
    assert auto.process_peaks(predictions, 1, baseline=100) is predictions
