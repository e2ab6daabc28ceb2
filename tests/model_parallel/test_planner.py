"""The planner's predictions from layer costs (pure, no TensorFlow)."""

import pytest

from tfdist.errors import ConfigError
from tfdist.model_parallel import planner, simulate

LAYERS = [planner.LayerCost(1.0, 1.0, 1.0, 100, 1000)] * 4  # F = I = W, equal layers
CUTS = {"gpipe": [0, 2, 4], "1f1b": [0, 2, 4], "zb": [0, 2, 4], "interleaved": [0, 1, 2, 3, 4]}


def _all(hop_s=0.0, m=4):
    return {n: planner.predict(n, LAYERS, CUTS[n], 2, m, 2 if n == "interleaved" else 1,
                               hop_s) for n in CUTS}


def test_balanced_layers_give_each_schedules_formula_and_its_memory():
    got = _all()
    for name, p in got.items():
        v = 2 if name == "interleaved" else 1
        assert p["bubble"] == pytest.approx(simulate.formula(name, 2, 4, v))
    # A device's weights (2 layers: 2000 bytes) x 4 (gradient sums, Adam's 2 slots), and
    # the activations in flight: GPipe all 4 micro-batches of 2 layers, 1F1B stage 0 2 of
    # them, interleaved (chunks of 1 layer) 5 on stage 0, ZB 2 on each stage.
    assert got["gpipe"]["peak_bytes"] == [8000 + 800] * 2
    assert got["1f1b"]["activation_bytes"] == [400, 200]
    assert got["interleaved"]["activation_bytes"] == [500, 300]
    assert got["zb"]["activation_bytes"] == [400, 400]
    assert planner.choose(got) == "zb"
    # Interleaving is faster than 1F1B but holds 8500 bytes on stage 0.
    assert planner.choose({n: p for n, p in got.items() if n != "zb"}) == "interleaved"
    assert planner.choose({n: p for n, p in got.items() if n != "zb"},
                          memory_limit_bytes=8450) == "1f1b"
    with pytest.raises(ConfigError, match="No pipeline schedule fits"):
        planner.choose(got, memory_limit_bytes=100)


def test_hand_offs_cost_interleaving_more_than_1f1b():
    slow = _all(hop_s=0.5)
    fast = _all()
    # Interleaving crosses 3 cuts a micro-batch each way, 1F1B one.
    assert (slow["interleaved"]["step_s"] - fast["interleaved"]["step_s"]
            > slow["1f1b"]["step_s"] - fast["1f1b"]["step_s"])


def test_cuts_that_do_not_match_the_schedule_are_refused():
    with pytest.raises(ConfigError, match="it cuts 4"):
        planner.predict("interleaved", LAYERS, [0, 2, 4], 2, 4, 2)
