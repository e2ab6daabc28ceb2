"""The planner's predictions from layer costs (pure, no TensorFlow)."""

import pytest

from tfdist.errors import ConfigError
from tfdist.model_parallel import schedules
from tfdist.model_parallel.planning import planner, simulate

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
    with pytest.raises(ConfigError, match=r"No pipeline schedule fits 0 MiB a process "
                                          r"\(predicted peaks: gpipe 0 MiB, .*Use more stages"):
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


def test_state_factor_counts_weight_slots_and_gradients_as_memory_plan_does():
    assert planner.state_factor(2, microbatches=1) == 4  # weight, 2 Adam slots, its gradient
    assert planner.state_factor(2, microbatches=4) == 5  # and a running sum beside it
    assert planner.state_factor(0, microbatches=1, copies=2) == 3


def test_interleaving_is_offered_only_where_m_is_a_multiple_of_p():
    assert planner.offered(2, 4) == {"gpipe": 1, "1f1b": 1, "zb": 1, "interleaved": 2}
    assert planner.offered(2, 4, virtual=3)["interleaved"] == 3
    assert "interleaved" not in planner.offered(4, 6)
    assert "interleaved" not in planner.offered(1, 4)


def test_plan_predicts_each_offered_schedule_over_its_own_cuts_and_a_baseline():
    def cut(chunks):
        return {2: [0, 2, 4], 4: [0, 1, 2, 3, 4]}.get(chunks)  # 8 chunks: cannot be cut

    got = planner.plan(LAYERS, cut, 2, 4, planner.offered(2, 4), baseline_bytes=10**6)
    assert set(got) == {"gpipe", "1f1b", "zb", "interleaved"}
    assert got["interleaved"]["bounds"] == [0, 1, 2, 3, 4] and got["interleaved"]["virtual"] == 2
    assert got["gpipe"]["peak_bytes"] == [10**6 + 8000 + 800] * 2
    assert got["zb"]["step_s"] == _all()["zb"]["step_s"]
    # A schedule whose cuts cannot be made is left out, not refused.
    assert set(planner.plan(LAYERS, cut, 2, 4, {"interleaved": 4})) == set()


def test_the_table_and_the_reason_name_the_pick_and_what_did_not_fit():
    got = planner.plan(LAYERS, lambda c: {2: [0, 2, 4], 4: [0, 1, 2, 3, 4]}[c], 2, 4,
                       planner.offered(2, 4))
    table = planner.format_predictions(got, memory_limit_bytes=8450).splitlines()
    assert table[0].split()[:3] == ["schedule", "step", "ms"]
    rows = {r.split()[0]: r.split() for r in table[2:]}
    assert rows["zb"][-1] == "yes" and rows["interleaved"][-1] == "no"
    assert rows["interleaved"][1] == "v=2"
    assert table[2].startswith("zb")  # fastest first
    assert float(rows["1f1b"][1]) == pytest.approx(got["1f1b"]["step_s"] * 1e3, abs=0.05)
    without_zb = {n: p for n, p in got.items() if n != "zb"}
    pick = planner.choose(without_zb, 8450)
    line = planner.reason(without_zb, pick, 8450)
    assert pick == "1f1b"
    assert line.startswith("tfdist: --schedule auto picked 1f1b: the fastest that fits")
    assert "(faster: interleaved, too large)" in line and "\n" not in line
    free = planner.reason(got, planner.choose(got), None)
    assert "picked zb: the fastest predicted:" in free


def test_each_device_updates_its_weights_after_its_last_action():
    # GPipe, 2 stages of 2 layers, M = 1, each layer's F, I and W 1 unit: device 0's forward
    # 0-2, device 1's 2-4 and its backward 4-8, device 0's backward 8-12.
    plain = planner.predict("gpipe", LAYERS, CUTS["gpipe"], 2, 1)
    assert plain["step_s"] == pytest.approx(12.0)
    on_first = [planner.LayerCost(1.0, 1.0, 1.0, 100, 1000, update_s=3.0)] + LAYERS[1:]
    assert planner.predict("gpipe", on_first, CUTS["gpipe"], 2, 1)["step_s"] == \
        pytest.approx(15.0)  # after the last backward, on device 0
    on_last = LAYERS[:3] + [planner.LayerCost(1.0, 1.0, 1.0, 100, 1000, update_s=3.0)]
    # Device 1 is done at 8, so its update ends at 11, before device 0's backward.
    assert planner.predict("gpipe", on_last, CUTS["gpipe"], 2, 1)["step_s"] == \
        pytest.approx(12.0)
    assert plain["bubble"] == planner.predict("gpipe", on_first, CUTS["gpipe"], 2, 1)["bubble"]


def test_each_action_pays_its_fixed_cost_so_more_actions_cost_more():
    # One device runs its actions back to back: M = 4 micro-batches of equal work under
    # 1F1B (8 actions: F, B), ZB (12: F, I, W) and interleaved V = 2 (16: two chunks'
    # F and B); each 12 units of work, and each action's fixed cost on top.
    def step(name, action=0.0):
        v = 2 if name == "interleaved" else 1
        return simulate.run(schedules.build(name, 1, 4, v), simulate.unit_cost(v),
                            action=action)

    for name, actions in (("1f1b", 8), ("zb", 12), ("interleaved", 16)):
        assert step(name)["step"] == pytest.approx(12.0)
        assert step(name, 0.25)["step"] == pytest.approx(12.0 + actions * 0.25)
        assert step(name, 0.25)["busy"] == [pytest.approx(12.0 + actions * 0.25)]
    # Twice 1F1B's actions: exactly 8 costs more.
    assert step("interleaved", 0.25)["step"] - step("1f1b", 0.25)["step"] == \
        pytest.approx(8 * 0.25)


def test_the_planner_adds_the_fixed_cost_to_every_action_on_the_way():
    # GPipe, M = 1 on 2 stages: device 0's F, device 1's F and B, device 0's B, one after
    # the other (12 units), so each of the 4 actions' cost is on the step.
    assert planner.predict("gpipe", LAYERS, CUTS["gpipe"], 2, 1, action_s=0.5)["step_s"] == \
        pytest.approx(12.0 + 4 * 0.5)
    # `plan` hands it on to each schedule.
    got = planner.plan(LAYERS, lambda c: {2: [0, 2, 4], 4: [0, 1, 2, 3, 4]}[c], 2, 4,
                       planner.offered(2, 4), action_s=0.5)
    for name, p in got.items():
        assert p["step_s"] == pytest.approx(planner.predict(
            name, LAYERS, p["bounds"], 2, 4, p["virtual"], action_s=0.5)["step_s"])
        assert p["step_s"] > _all()[name]["step_s"]


def test_each_weight_gradient_after_a_chunks_first_is_added_into_its_running_sum():
    # One device, M = 4: the first micro-batch's weight gradients start a chunk's sum,
    # the other 3 are added to it, in the action that makes them (B, or ZB's W).
    def step(name, accumulate=None):
        v = 2 if name == "interleaved" else 1
        return simulate.run(schedules.build(name, 1, 4, v), simulate.unit_cost(v),
                            accumulate=accumulate)["step"]

    assert step("1f1b", lambda k: 0.5) == pytest.approx(12.0 + 3 * 0.5)
    assert step("zb", lambda k: 0.5) == pytest.approx(12.0 + 3 * 0.5)
    # Interleaved: two chunks a device, each its own sum; chunk 1's adds cost 1.
    assert step("interleaved", lambda k: [0.5, 1.0][k]) == \
        pytest.approx(12.0 + 3 * 0.5 + 3 * 1.0)
    # The planner takes it from the layers: GPipe, M = 2 on 2 stages, one add a stage.
    adds = [planner.LayerCost(1.0, 1.0, 1.0, 100, 1000, accumulate_s=0.25)] * 4
    base = planner.predict("gpipe", LAYERS, CUTS["gpipe"], 2, 2)
    got = planner.predict("gpipe", adds, CUTS["gpipe"], 2, 2)
    # Stage 1's second backward and then stage 0's are on the step's path: 2 x 0.5.
    assert got["step_s"] == pytest.approx(base["step_s"] + 2 * 0.5)
    assert got["busy_s"] == [pytest.approx(b + 0.5) for b in base["busy_s"]]


def test_a_batched_dense_weight_gradient_moves_from_each_backward_to_the_stage_end():
    from tfdist.model_parallel.planning import planner

    # 2 layers, one a stage: F 1, I 1, W 1 a micro-batch, weight gradients batched up to M = 8.
    layers = [planner.LayerCost(1.0, 1.0, 1.0, 10, 100, accumulate_s=0.5, batched_upto=8)] * 2
    chunks = planner.chunk_costs(layers, [0, 1, 2], microbatches=4)
    assert chunks[0]["W"] == 0 and chunks[0]["A"] == 0 and chunks[0]["WB"] == 4.0
    unbatched = planner.chunk_costs(layers, [0, 1, 2], microbatches=16)  # past 8: per micro-batch
    assert unbatched[0]["W"] == 1.0 and unbatched[0]["A"] == 0.5 and unbatched[0]["WB"] == 0
    one = planner.predict("1f1b", layers, [0, 1, 2], 2, 4)
    # 1F1B at M = 4 with B = I only: stage 0 busy 4 F + 4 I after one slot of wait,
    # then its 4 batched W; zero bubble has no W left to move into its bubble.
    zb = planner.predict("zb", layers, [0, 1, 2], 2, 4)
    assert zb["step_s"] >= one["step_s"]
    assert one["step_s"] == pytest.approx(planner.predict("1f1b", [planner.LayerCost(
        1.0, 1.0, 0.0, 10, 100)] * 2, [0, 1, 2], 2, 4)["step_s"] + 4.0)


def test_profile_batches_a_plain_dense_up_to_the_rows_its_kernel_outweighs():
    import keras
    import numpy as np

    from tfdist.model_parallel.planning import profile

    layer = keras.layers.Dense(64)
    layer.build((None, 64))
    x = np.zeros((4, 64), "float32")
    assert profile.batched_upto(layer, [x]) == 64 * 64 // (128 * 4)  # 8 micro-batches of 4
    assert profile.batched_upto(keras.layers.Dense(4, dtype="mixed_float16"), [x]) == 0
    assert profile.batched_upto(layer, [x, x]) == 0
