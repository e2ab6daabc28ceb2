"""Pipeline schedules as data (pure, no TensorFlow)."""

import pytest

from tfdist.errors import ConfigError
from tfdist.model_parallel import schedules
from tfdist.model_parallel.planning import simulate

# Every schedule at every size below: (name, V).
EVERY = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3), ("zb", 1)]
SIZES = [(2, 2), (2, 4), (2, 8), (4, 4), (4, 8), (3, 6), (4, 16), (8, 16)]


def test_gpipe_runs_every_forward_then_every_backward():
    assert schedules.gpipe(2, 3) == [[("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1),
                                      ("B", 2)]] * 2


def test_one_f_one_b_warms_up_alternates_and_drains():
    s = schedules.one_f_one_b(3, 4)
    assert schedules.draw(s).splitlines() == [
        "stage 0: F0 F1 F2 B0 F3 B1 B2 B3",
        "stage 1: F0 F1 B0 F2 B1 F3 B2 B3",
        "stage 2: F0 B0 F1 B1 F2 B2 F3 B3"]


@pytest.mark.parametrize("p, m", [(1, 1), (2, 1), (2, 8), (4, 8), (4, 2), (3, 16)])
def test_every_schedule_does_each_action_once_and_can_run(p, m):
    for name in ("gpipe", "1f1b"):
        s = schedules.build(name, p, m)
        for actions in s:
            assert sorted(actions) == sorted([("F", i) for i in range(m)] +
                                             [("B", i) for i in range(m)])
            # A backward never comes before its own forward on a stage.
            assert all(actions.index(("F", i)) < actions.index(("B", i)) for i in range(m))
        assert len(schedules.order(s)) == 2 * p * m
    zb = schedules.build("zb", p, m)
    assert schedules.check(zb, m) == p and len(schedules.order(zb)) == 3 * p * m


@pytest.mark.parametrize("p, m", SIZES)
@pytest.mark.parametrize("name, v", EVERY)
def test_new_schedules_are_complete_and_respect_every_dependency(name, v, p, m):
    if name == "interleaved" and m % p:
        pytest.skip("interleaved takes M a multiple of P")
    s = schedules.build(name, p, m, v)
    chunks = schedules.check(s, m)  # each action once, every chunk complete, F before B
    assert chunks == schedules.chunks(name, p, v) == p * (v if name == "interleaved" else 1)
    seen = set()
    for d, kind, i, k in schedules.order(s):
        assert k % p == d  # chunk k lives on device k mod P
        if kind == "F":
            assert k == 0 or ("F", i, k - 1) in seen
        elif kind == "W":
            assert ("G", i, k) in seen
        else:
            assert ("F", i, k) in seen and (k == chunks - 1 or ("G", i, k + 1) in seen)
        seen.add(("F" if kind == "F" else "G" if kind != "W" else "W", i, k))
    # Each chunk's weight gradients are made in micro-batch order (summed as GPipe sums).
    for d, actions in enumerate(s):
        for k in range(d, chunks, p):
            made = [schedules.parts(a, d)[1] for a in actions
                    if schedules.parts(a, d)[0] in "BW" and schedules.parts(a, d)[2] == k]
            assert made == list(range(m))


@pytest.mark.parametrize("p, m", SIZES)
def test_unit_time_bubbles_are_the_formulas(p, m):
    """F = 1, I = W = 1 (B = 2), split over V chunks: gpipe, 1f1b and interleaved
    are their formulas exactly; ZB-H1 reaches (P-1)/(3M+P-1) at P = 2 and stays
    within 2 time steps of it (and well below 1F1B's) at P = 3, 4, 8."""
    unit = {name: simulate.run(schedules.build(name, p, m, v), simulate.unit_cost(v))
            for name, v in EVERY if name != "interleaved" or m % p == 0}
    for name in ("gpipe", "1f1b"):
        assert unit[name]["bubble"] == pytest.approx(simulate.formula(name, p, m))
    for v in (2, 3):
        if m % p == 0:
            got = simulate.run(schedules.build("interleaved", p, m, v), simulate.unit_cost(v))
            assert got["bubble"] == pytest.approx(simulate.formula("interleaved", p, m, v))
    zb = unit["zb"]
    ideal = 3 * m + p - 1
    assert zb["step"] == ideal if p == 2 else ideal <= zb["step"] <= ideal + 2
    assert zb["bubble"] < unit["1f1b"]["bubble"]


def test_in_flight_zb_within_1f1bs_peak_interleaved_megatrons_bound():
    for p, m in SIZES:
        peak_1f1b = max(schedules.peak_in_flight(a) for a in schedules.one_f_one_b(p, m))
        assert max(schedules.peak_in_flight(a) for a in schedules.zero_bubble(p, m)) <= peak_1f1b
        for v in (2, 3):
            if m % p == 0 and m >= p:
                # Megatron: (1 + (P-1)/(P V)) x 1F1B's, in chunks of 1/V of a stage.
                peaks = [schedules.peak_in_flight(a)
                         for a in schedules.interleaved(p, m, v)]
                assert max(peaks) / v <= peak_1f1b * (1 + (p - 1) / (p * v)) + 1e-9


def test_interleaved_and_zb_drawn():
    assert schedules.draw(schedules.interleaved(2, 4, 2)).splitlines() == [
        "stage 0: F0.0 F1.0 F0.2 F1.2 F2.0 B0.2 F3.0 B1.2 F2.2 B0.0 F3.2 B1.0 B2.2 B3.2 B2.0 B3.0",
        "stage 1: F0.1 F1.1 F0.3 B0.3 F1.3 B1.3 F2.1 B0.1 F3.1 B1.1 F2.3 B2.3 F3.3 B3.3 B2.1 B3.1"]
    assert schedules.draw(schedules.zero_bubble(2, 4)).splitlines() == [
        "stage 0: F0 F1 I0 W0 I1 F2 W1 F3 I2 W2 I3 W3",
        "stage 1: F0 I0 F1 I1 W0 W1 F2 I2 F3 I3 W2 W3"]


@pytest.mark.parametrize("p, m", [(2, 8), (4, 8), (4, 16)])
def test_one_f_one_b_holds_at_most_p_micro_batches_gpipe_holds_m(p, m):
    assert max(schedules.peak_in_flight(a) for a in schedules.one_f_one_b(p, m)) == p
    assert max(schedules.peak_in_flight(a) for a in schedules.gpipe(p, m)) == m


def test_order_respects_data_dependencies():
    seen = set()
    for s, kind, i, k in schedules.order(schedules.one_f_one_b(3, 4)):
        assert k == s
        if kind == "F":
            assert s == 0 or (s - 1, "F", i) in seen
        else:
            assert (s, "F", i) in seen and (s == 2 or (s + 1, "B", i) in seen)
        seen.add((s, kind, i))


def test_a_deadlocking_schedule_and_unknown_names_are_refused():
    with pytest.raises(ConfigError, match="deadlocks"):
        schedules.order([[("F", 0), ("B", 0)], [("B", 0), ("F", 0)]])
    with pytest.raises(ConfigError, match=r"--schedule must be one of gpipe, 1f1b, "
                                          r"interleaved, zb. Received: 'zb1'"):
        schedules.build("zb1", 2, 2)
    with pytest.raises(ConfigError, match="microbatches >= 1"):
        schedules.gpipe(2, 0)
    with pytest.raises(ConfigError, match=r"--virtual-stages 2 .* Received: --schedule 1f1b"):
        schedules.build("1f1b", 2, 4, 2)
    with pytest.raises(ConfigError, match=r"multiple of the 2 stages.*--microbatches 3. Use "
                                          r"--virtual-stages 2 and --microbatches 4"):
        schedules.build("interleaved", 2, 3, 2)
    with pytest.raises(ConfigError, match=r"--virtual-stages V >= 2"):
        schedules.build("interleaved", 2, 4, 1)
    with pytest.raises(ConfigError, match="misses W0"):
        schedules.check([[("F", 0), ("I", 0)]], 1)
    with pytest.raises(ConfigError, match="before its forward"):
        schedules.check([[("I", 0), ("F", 0), ("W", 0)]], 1)
    with pytest.raises(ConfigError, match="cannot run"):
        schedules.check([[("F", 0, 1), ("B", 0, 1)], []], 1)
