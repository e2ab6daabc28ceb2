"""Interleaved 1F1B and zero bubble run by the pipeline, in-process on one device.

Every schedule only reorders work: each stage sums its micro-batches' weight
gradients in micro-batch order, so after Adam steps the weights are GPipe's,
bit for bit where the ops are the same (a Dense stack), within float32
rounding where zero bubble's call-by-call backward sums a tensor's gradients
in another order (a residual read by two layers).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest


def _mlp(keras, layers=5):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16,))
    h = inputs
    for j in range(layers - 1):
        h = keras.layers.Dense(24, activation="relu", name=f"d{j}")(h)
    return keras.Model(inputs, keras.layers.Dense(4, name="out")(h))


def _residual(keras):
    """Tokens in (an Embedding: IndexedSlices gradients), a residual read by two layers."""
    keras.utils.set_random_seed(0)
    tokens = keras.Input((5,), dtype="int32")
    e = keras.layers.Flatten(name="flat")(keras.layers.Embedding(11, 4, name="emb")(tokens))
    a = keras.layers.Dense(12, activation="tanh", name="a")(e)
    b = keras.layers.Dense(12, activation="tanh", name="b")(a)
    c = keras.layers.Add(name="res")([a, b])
    d = keras.layers.Dense(12, activation="relu", name="d")(c)
    return keras.Model(tokens, keras.layers.Dense(3, name="out")(d))


def _train(build, schedule, stages, microbatches=4, virtual=1, copies=1, steps=6, data=None,
           node_costs=None, split=None):
    import keras

    from tfdist.model_parallel import pipeline

    split = split or pipeline.split(build(keras), ["/cpu:0"] * (stages * copies),
                                    microbatches=microbatches, schedule=schedule,
                                    copies=copies, virtual_stages=virtual,
                                    node_costs=node_costs)
    split.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = data
    split.fit(x, y, batch_size=len(y) // steps, epochs=1, shuffle=False, verbose=0)
    return split, [np.asarray(w.numpy()) for w in split.inner.weights]


def _data(rows=96, tokens=False):
    rng = np.random.default_rng(0)
    x = (rng.integers(0, 11, (rows, 5)).astype("int32") if tokens
         else rng.normal(size=(rows, 16)).astype("float32"))
    return x, rng.integers(0, 3 if tokens else 4, rows)


@functools.lru_cache(maxsize=None)
def _gpipe(copies):
    """GPipe's weights on 2 stages (the cut does not change GPipe's sums)."""
    return _train(_mlp, "gpipe", 2, copies=copies, data=_data())[1]


@pytest.mark.parametrize("schedule, stages, virtual, copies", [
    ("interleaved", 2, 2, 1), ("zb", 2, 1, 1), ("zb", 4, 1, 1), ("interleaved", 2, 2, 2),
    ("zb", 2, 1, 2)])
def test_new_schedules_end_with_gpipes_weights(schedule, stages, virtual, copies):
    """Interleaved bit for bit with one copy; with 2 copies its other cuts leave 1.6e-6
    relative (float32 rounding of the copies' sums). Zero bubble sums each micro-batch's
    Dense weight gradients where GPipe takes them once over the batch
    (batched_weight_grads): float32 rounding of another summation order."""
    reference = _gpipe(copies)
    split, weights = _train(_mlp, schedule, stages, virtual=virtual, copies=copies,
                            data=_data())
    assert len(split.stages) == stages * virtual
    moved = max(float(np.abs(a - b).max()) for a, b in zip(weights, _mlp(
        __import__("keras")).get_weights()))
    assert moved > 1e-2  # Adam trained
    for a, b in zip(weights, reference):
        if copies == 1 and schedule != "zb":
            np.testing.assert_array_equal(a, b)
        elif schedule == "zb":  # per tensor, against its largest entry (a real error: 1e-3)
            assert np.abs(a - b).max() <= 1e-6 * np.abs(b).max(), np.abs(a - b).max()
        else:
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_interleaved_chunks_cycle_over_the_devices():
    import keras

    from tfdist.model_parallel import pipeline

    assert pipeline._chunks([("a",), ("b",)], 2) == [("a",), ("b",), ("a",), ("b",)]
    split = pipeline.split(_mlp(keras), ["/cpu:0", "/cpu:0"], microbatches=4,
                           schedule="interleaved", virtual_stages=2)
    assert [len(layers) for layers in split.stage_layers] == [1, 1, 1, 2]
    assert split.plan.num_stages == 4 and len(split.schedule) == 2


def test_zero_bubble_with_a_residual_and_an_embedding_ends_with_gpipes_weights():
    data = _data(tokens=True)
    reference = _train(_residual, "gpipe", 2, data=data)[1]
    weights = _train(_residual, "zb", 2, data=data)[1]
    for a, b in zip(weights, reference):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_virtual_stages_without_interleaving_and_m_not_a_multiple_of_p_are_refused():
    import keras

    from tfdist.errors import ConfigError
    from tfdist.model_parallel import pipeline

    with pytest.raises(ConfigError, match=r"--virtual-stages 2 .*Received: --schedule zb"):
        pipeline.split(_mlp(keras), ["/cpu:0"] * 2, microbatches=4, schedule="zb",
                       virtual_stages=2)
    with pytest.raises(ConfigError, match=r"--microbatches 3"):
        pipeline.split(_mlp(keras), ["/cpu:0"] * 2, microbatches=3, schedule="interleaved",
                       virtual_stages=2)


def test_cuts_balanced_by_time_move_and_end_with_the_same_weights():
    """--balance time only moves the cuts: by parameters d0, d1 | d2, d3, out;
    the last Dense made to weigh as much as the four before it stands alone."""
    import keras

    from tfdist.model_parallel import pipeline

    by_parameters = pipeline.split(_mlp(keras), ["/cpu:0"] * 2, microbatches=4)
    assert [len(layers) for layers in by_parameters.stage_layers] == [2, 3]
    split, weights = _train(_mlp, "gpipe", 2, data=_data(), node_costs=[1, 1, 1, 1, 4])
    assert [len(layers) for layers in split.stage_layers] == [4, 1]
    for a, b in zip(weights, _gpipe(1)):
        np.testing.assert_array_equal(a, b)


def test_schedule_auto_prints_the_planners_table_picks_one_and_trains_to_gpipes_weights(
        capsys):
    import keras

    from tfdist.strategies import pipeline as strategy
    from tfdist.strategies.options import StrategyOptions

    options = StrategyOptions(microbatches=4, schedule="auto", balance="time")
    split = strategy.transform_model(_mlp(keras), options, devices=["/cpu:0"] * 2,
                                     global_batch_size=16)
    out = capsys.readouterr().out
    table = out[out.index("tfdist: the planner's predictions"):].splitlines()
    assert "4 micro-batches of 4 rows" in table[0] and "cuts by time" in table[0]
    assert {r.split()[0] for r in table[3:7]} == {"gpipe", "1f1b", "zb", "interleaved"}
    picked = next(line for line in out.splitlines() if "--schedule auto picked" in line)
    name = picked.split("picked ")[1].split(":")[0].split()[0]
    assert f"schedule={name}" in out  # the pipeline runs what the planner picked
    weights = _train(_mlp, None, 2, data=_data(), split=split)[1]
    for a, b in zip(weights, _gpipe(1)):  # whatever it picked and wherever it cut
        np.testing.assert_array_equal(a, b)


def test_schedule_auto_takes_the_one_schedule_that_fits_the_memory_limit(monkeypatch):
    """The limit is a cgroup's or MemAvailable (`memory_limit`); here it is set so that
    only the schedules with the smallest predicted peak fit (activation bytes are exact)."""
    import keras

    from tfdist import memory_limit
    from tfdist.model_parallel.planning import auto
    from tfdist.strategies.options import StrategyOptions

    options = StrategyOptions(microbatches=4, schedule="auto")
    monkeypatch.setattr(memory_limit, "rss_bytes", lambda: 0)
    monkeypatch.setattr(memory_limit, "headroom_bytes", lambda: None)
    free = auto.plan(_mlp(keras), options, 2, 16, repeats=1)
    peaks = {n: sum(p["peak_bytes"]) for n, p in free.predictions.items()}  # one process
    smallest = min(peaks.values())
    assert peaks["gpipe"] > smallest  # GPipe holds all 4 micro-batches
    monkeypatch.setattr(memory_limit, "headroom_bytes", lambda: smallest)
    tight = auto.plan(_mlp(keras), options, 2, 16, repeats=1)
    assert peaks[tight.schedule] == smallest
    assert "the fastest" in tight.lines[-1] and "fits 0 MiB a process" in tight.lines[-1]
    fits = {row.split()[0]: row.split()[-1] for row in tight.lines[0].splitlines()[3:]}
    assert fits["gpipe"] == "no" and fits[tight.schedule] == "yes"
