"""The planner's measured pass on a small model (in-process)."""

import numpy as np


def test_each_layer_call_is_timed_and_its_bytes_counted():
    import keras

    from tfdist.model_parallel import graph as graph_lib
    from tfdist.model_parallel import schedules
    from tfdist.model_parallel.planning import planner, profile

    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    h = keras.layers.Dense(32, activation="relu", name="a")(inputs)
    h = keras.layers.Dropout(0.1, name="drop")(h)
    h = keras.layers.Dense(32, activation="relu", name="b")(h)
    model = keras.Model(inputs, keras.layers.Dense(4, name="out")(h))
    costs = profile.layer_costs(model, [np.ones((16, 8), "float32")], repeats=2)
    assert len(costs) == 4  # a, drop, b, out: the nodes the cuts index
    assert [c.weight_bytes for c in costs] == [(8 * 32 + 32) * 4, 0, (32 * 32 + 32) * 4,
                                               (32 * 4 + 4) * 4]
    assert [c.activation_bytes for c in costs] == [16 * 32 * 4] * 3 + [16 * 4 * 4]
    assert all(c.forward_s > 0 for c in costs)
    # A layer with weights has its update and its running sum's add timed; Dropout none.
    assert costs[1].update_s == costs[1].accumulate_s == 0.0
    assert all(c.accumulate_s >= 0.0 for c in costs)
    graph = graph_lib.from_keras(model)
    bounds = [0, *graph_lib.balanced_cuts(graph, 2), len(graph.nodes)]
    got = planner.predict("zb", costs, bounds, 2, 4)
    assert got["step_s"] > 0 and len(got["peak_bytes"]) == 2
    assert schedules.chunks("interleaved", 2, 2) == 4


def test_a_model_without_values_is_timed_on_fresh_copies_and_left_as_it_was():
    """The chief of stage processes holds the model without values (`deferred`)."""
    import random

    import keras

    from tfdist.model_parallel import deferred
    from tfdist.model_parallel.planning import profile

    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((8,))
        h = keras.layers.Dropout(0.5, name="drop")(keras.layers.Dense(16, name="a")(inputs))
        return keras.Model(inputs, keras.layers.Dense(4, name="out")(h))

    model = deferred.build_without_values(build)
    assert deferred.has_deferred(model)
    state = random.getstate()
    costs = profile.layer_costs(model, profile.sample_inputs(model, 8), repeats=1)
    assert random.getstate() == state  # a copy's seeds are not drawn from the run's
    assert deferred.has_deferred(model)  # no value was made in the model itself
    assert [c.weight_bytes for c in costs] == [(8 * 16 + 16) * 4, 0, (16 * 4 + 4) * 4]
    assert [c.activation_bytes for c in costs] == [8 * 16 * 4] * 2 + [8 * 4 * 4]


def test_the_fixed_cost_of_an_action_is_timed_in_a_graph():
    from tfdist.model_parallel.planning import profile

    got = profile.action_s(repeats=3, actions=32)
    # The executor's cost of a few ops and a control edge: microseconds, never negative
    # (a slope of two noisy timings is clamped), far from a tf.function call's 0.1 ms.
    assert 0.0 <= got < 1e-3
