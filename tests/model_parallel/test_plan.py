"""Model-parallel arithmetic, without TensorFlow."""

import pytest

from tfdist.errors import ConfigError
from tfdist.model_parallel import plan


@pytest.mark.parametrize("items, parts, sizes", [
    (4, 2, [2, 2]), (5, 2, [3, 2]), (7, 3, [3, 2, 2]), (3, 3, [1, 1, 1]), (9, 1, [9])])
def test_even_split(items, parts, sizes):
    assert plan.even_split(items, parts) == sizes


def test_even_split_needs_an_item_per_device():
    with pytest.raises(ConfigError, match=r"Cannot split 2 item\(s\) over 3 devices.*--devices 2"):
        plan.even_split(2, 3)


@pytest.mark.parametrize("p, m, expected", [(1, 1, 0.0), (2, 1, 0.5), (2, 4, 0.2),
                                            (4, 8, 3 / 11), (4, 1, 0.75)])
def test_bubble_fraction(p, m, expected):
    assert plan.bubble_fraction(p, m) == pytest.approx(expected)


def test_measured_bubble():
    # GPipe, 2 balanced stages of 1 s each per micro-batch, 4 micro-batches: 5 s per step.
    assert plan.measured_bubble(5.0, [4.0, 4.0]) == pytest.approx(plan.bubble_fraction(2, 4))
    with pytest.raises(ValueError):
        plan.measured_bubble(0.0, [1.0])


def test_microbatch_size():
    assert plan.microbatch_size(64, 8) == 8
    with pytest.raises(ConfigError, match=r"global_batch_size=64 is not divisible by "
                                          r"microbatches=3"):
        plan.microbatch_size(64, 3)
    with pytest.raises(ConfigError, match=r"--microbatches must be >= 1. Received: 0"):
        plan.microbatch_size(64, 0)


def test_parse_placement():
    assert plan.parse_placement("a, b=/cpu:0; c=/gpu:1;") == [("/cpu:0", ["a", "b"]),
                                                             ("/gpu:1", ["c"])]
    with pytest.raises(ConfigError, match=r"Received group: 'a:/cpu:0'"):
        plan.parse_placement("a:/cpu:0")
    with pytest.raises(ConfigError, match=r"Layer 'a' is placed twice"):
        plan.parse_placement("a=/cpu:0;a=/cpu:1")


def test_groups_must_cover_the_model_in_order():
    names = ["a", "b", "c"]
    plan.check_groups_cover([("/cpu:0", ["a", "b"]), ("/cpu:1", ["c"])], names)
    with pytest.raises(ConfigError, match=r"does not have: \['x'\]"):
        plan.check_groups_cover([("/cpu:0", ["a", "b", "c", "x"])], names)
    with pytest.raises(ConfigError, match=r"leaves layers unplaced: \['c'\]"):
        plan.check_groups_cover([("/cpu:0", ["a", "b"])], names)
    with pytest.raises(ConfigError, match=r"in model order"):
        plan.check_groups_cover([("/cpu:0", ["b", "a"]), ("/cpu:1", ["c"])], names)


def test_placement_table_totals_per_device():
    rows = [("a", "CPU:0", 100, 400), ("b", "CPU:1", 50, 200), ("c", "CPU:1", 50, 200)]
    assert plan.device_totals(rows) == {"CPU:0": (100, 400), "CPU:1": (100, 400)}
    table = plan.format_placement(rows)
    assert table.splitlines()[-1].split() == ["total", "CPU:1", "100", "400", "(50%)"]
    assert table.splitlines()[0].split() == ["layer", "device", "params", "bytes"]


def test_placement_may_leave_out_weightless_layers_but_not_weighted_ones():
    names = ["embed", "pool", "d1", "drop", "out"]
    groups = plan.attach_weightless([("/cpu:0", ["embed"]), ("/cpu:1", ["d1", "out"])], names,
                                    {"pool", "drop"})
    assert groups == [("/cpu:0", ["embed", "pool"]), ("/cpu:1", ["d1", "drop", "out"])]
    # Naming a weightless layer places it where it is named.
    groups = plan.attach_weightless([("/cpu:0", ["embed"]), ("/cpu:1", ["pool", "d1", "out"])],
                                    names, {"pool", "drop"})
    assert groups == [("/cpu:0", ["embed"]), ("/cpu:1", ["pool", "d1", "drop", "out"])]
    with pytest.raises(ConfigError, match=r"leaves layers unplaced: \['d1'\]"):
        plan.attach_weightless([("/cpu:0", ["embed"]), ("/cpu:1", ["out"])], names,
                               {"pool", "drop"})
    with pytest.raises(ConfigError, match=r"in model order"):
        plan.attach_weightless([("/cpu:0", ["d1"]), ("/cpu:1", ["embed", "out"])], names,
                               {"pool", "drop"})
