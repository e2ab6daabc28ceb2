"""A LayoutMap read as tensor-parallel layers, or refused with one line naming the variable."""

from __future__ import annotations

import pytest

from tfdist.errors import ConfigError
from tfdist.keras_distribution.layouts import Split, Weight, plan

MESH = {"batch": 1, "model": 2}


def dense(name, fan_in, units, kernel=None, bias=None, kind="Dense"):
    return [Weight(f"{name}/kernel", (fan_in, units), name, kind, kernel),
            Weight(f"{name}/bias", (units,), name, kind, bias)]


def test_output_axis_is_column_input_axis_is_row():
    weights = (dense("d1", 16, 32, (None, "model"), ("model",))
               + dense("d2", 32, 4, ("model", None)) + dense("d3", 4, 4))
    assert plan(weights, MESH, "batch") == [Split("d1", "column", "model"),
                                            Split("d2", "row", "model")]


def test_an_axis_of_one_device_splits_nothing():
    assert plan(dense("d1", 4, 4, (None, "model")), {"batch": 2, "model": 1}, "batch") == []


@pytest.mark.parametrize("weights, words", [
    (dense("d1", 4, 4, ("model", "model")), ["'d1/kernel'", "('model', 'model')", "two dimensions"]),
    (dense("d1", 4, 4, ("batch", None)), ["'d1/kernel'", "batch axis", "ZeRO-3"]),
    (dense("d1", 4, 4, (None,)), ["'d1/kernel'", "1 axes", "shape (4, 4)"]),
    (dense("d1", 4, 4, None, ("model",)), ["'d1/bias'", "its kernel is not split"]),
    (dense("d1", 4, 4, ("model", None), ("model",)), ["'d1/bias'", "input axis"]),
    ([Weight("c/kernel", (3, 3, 1, 8), "c", "Conv2D", (None, None, None, "model"))],
     ["'c/kernel'", "Conv2D", "Dense kernels only"]),
])
def test_a_layout_no_split_can_honour_is_refused_naming_the_variable(weights, words):
    mesh = {"batch": 2, "model": 2}
    with pytest.raises(ConfigError) as e:
        plan(weights, mesh, "batch")
    for word in words:
        assert word in str(e.value), str(e.value)
    assert "What works" in str(e.value) or "batch axis" in str(e.value) or "axes" in str(e.value)


def test_a_split_across_processes_is_refused():
    with pytest.raises(ConfigError, match="spans 2 processes"):
        plan(dense("d1", 4, 4, (None, "model")), MESH, "batch", processes=2)
