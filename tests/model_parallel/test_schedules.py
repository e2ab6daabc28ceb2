"""Pipeline schedules as data (pure, no TensorFlow)."""

import pytest

from tfdist.errors import ConfigError
from tfdist.model_parallel import schedules


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
    for name in schedules.NAMES:
        s = schedules.build(name, p, m)
        for actions in s:
            assert sorted(actions) == sorted([("F", i) for i in range(m)] +
                                             [("B", i) for i in range(m)])
            # A backward never comes before its own forward on a stage.
            assert all(actions.index(("F", i)) < actions.index(("B", i)) for i in range(m))
        assert len(schedules.order(s)) == 2 * p * m


@pytest.mark.parametrize("p, m", [(2, 8), (4, 8), (4, 16)])
def test_one_f_one_b_holds_at_most_p_micro_batches_gpipe_holds_m(p, m):
    assert max(schedules.peak_in_flight(a) for a in schedules.one_f_one_b(p, m)) == p
    assert max(schedules.peak_in_flight(a) for a in schedules.gpipe(p, m)) == m


def test_order_respects_data_dependencies():
    seen = set()
    for s, kind, i in schedules.order(schedules.one_f_one_b(3, 4)):
        if kind == "F":
            assert s == 0 or (s - 1, "F", i) in seen
        else:
            assert (s, "F", i) in seen and (s == 2 or (s + 1, "B", i) in seen)
        seen.add((s, kind, i))


def test_a_deadlocking_schedule_and_unknown_names_are_refused():
    with pytest.raises(ConfigError, match="deadlocks"):
        schedules.order([[("F", 0), ("B", 0)], [("B", 0), ("F", 0)]])
    with pytest.raises(ConfigError, match=r"--schedule must be one of gpipe, 1f1b. "
                                          r"Received: 'zb'"):
        schedules.build("zb", 2, 2)
    with pytest.raises(ConfigError, match="microbatches >= 1"):
        schedules.gpipe(2, 0)
