"""The Stage and the split plan: what `pipeline.split` hands the model, in-process on one device."""

from __future__ import annotations

import numpy as np


def _transformerish(keras):
    """Two inputs, a residual crossing the cut, a weightless layer: what stages must carry."""
    keras.utils.set_random_seed(0)
    x = keras.Input((6,), name="x")
    z = keras.Input((6,), name="z")
    a = keras.layers.Dense(8, activation="relu", name="a")(x)
    b = keras.layers.Dense(8, name="b")(a)
    c = keras.layers.Add(name="res")([a, b])
    d = keras.layers.Dense(8, name="d")(keras.layers.Concatenate(name="cat")([c, z]))
    return keras.Model([x, z], keras.layers.Dense(3, name="out")(d))


def test_split_hands_one_plan_and_each_stage_holds_its_layers_variables_and_crossings(
        monkeypatch):
    import keras

    from tfdist.model_parallel import graph as graph_lib
    from tfdist.model_parallel import pipeline

    model = _transformerish(keras)
    calls = []
    real = graph_lib.from_keras
    monkeypatch.setattr(graph_lib, "from_keras",
                        lambda m, calls_=None: calls.append(m.name) or real(m, calls_))
    split = pipeline.split(model, ["/cpu:0"] * 4, copies=2)
    # The model's graph once for the plan, then each placed copy's once (its own tensors).
    assert len(calls) == 3
    plan = split.plan
    assert plan.num_stages == 2 and len(plan.copy_groups) == 2
    assert set(plan.stage_of()) == {layer.name for layer in model.layers
                                    if not isinstance(layer, keras.layers.InputLayer)}
    for copy, stages in zip(split._copies, split.pipelines):
        held = [v for stage in stages for v in stage.variables]
        assert len(held) == len({id(v) for v in held})  # each variable in one stage
        assert {id(v) for v in held} == {id(v) for v in copy.trainable_variables}
        assert [s.last for s in stages] == [False, True]
        assert stages[1].inputs == stages[0].outputs  # what crosses the cut, in one order
    # Copy 1's stages are other layers holding the same values.
    first, other = split.pipelines
    for a, b in zip(first, other):
        assert all(x is not y for x, y in zip(a.variables, b.variables))
        for x, y in zip(a.variables, b.variables):
            np.testing.assert_array_equal(x.numpy(), y.numpy())


def test_stages_run_in_turn_give_the_models_output():
    import keras

    from tfdist.model_parallel import pipeline

    model = _transformerish(keras)
    split = pipeline.split(model, ["/cpu:0"] * 3)
    rng = np.random.default_rng(0)
    x, z = rng.normal(size=(5, 6)).astype("float32"), rng.normal(size=(5, 6)).astype("float32")
    values = [x, z]
    for stage in split.stages:
        values = stage.forward(values)
    np.testing.assert_allclose(values[0], model([x, z]), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(split([x, z]), model([x, z]), rtol=1e-6, atol=1e-6)


def test_assign_from_gives_a_copys_stage_the_first_copys_weights():
    import keras

    from tfdist.model_parallel import pipeline

    split = pipeline.split(_transformerish(keras), ["/cpu:0"] * 4, copies=2)
    first, other = split.pipelines
    for v in first[1].variables:
        v.assign(v + 1.0)
    split.sync_copies()
    for a, b in zip(first[1].variables, other[1].variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
