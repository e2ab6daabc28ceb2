"""The planner's measured pass on a small model (in-process)."""

import numpy as np


def test_each_layer_call_is_timed_and_its_bytes_counted():
    import keras

    from tfdist.model_parallel import graph as graph_lib
    from tfdist.model_parallel import planner, profile, schedules

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
    graph = graph_lib.from_keras(model)
    bounds = [0, *graph_lib.balanced_cuts(graph, 2), len(graph.nodes)]
    got = planner.predict("zb", costs, bounds, 2, 4)
    assert got["step_s"] > 0 and len(got["peak_bytes"]) == 2
    assert schedules.chunks("interleaved", 2, 2) == 4
