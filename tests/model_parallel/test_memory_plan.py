"""The memory each process of a split model holds in a step, read before the first step."""

from __future__ import annotations

from tfdist.model_parallel.planning import memory_plan


def _rows(model, schedule, microbatch_rows):
    """The memory plan of `model` cut in 2 stages at M = 4 under `schedule`, Adam built."""
    import keras

    from tfdist.model_parallel import pipeline

    split = pipeline.split(model, ["/cpu:0", "/cpu:0"], microbatches=4, schedule=schedule)
    split.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    split.optimizer.build(split.trainable_variables)
    return memory_plan.device_rows(split, microbatch_rows=microbatch_rows)


def test_weights_slots_gradients_and_activations_per_process():
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((16,))
    h = keras.layers.Dense(32, activation="relu", name="d0")(inputs)
    h = keras.layers.Dense(32, activation="relu", name="d1")(h)
    model = keras.Model(inputs, keras.layers.Dense(4, name="out")(h))
    (row,) = _rows(model, "1f1b", microbatch_rows=8)
    name, weights, optimizer, gradients, activations, in_flight = row
    assert name == "CPU:0"
    assert weights == 4 * (16 * 32 + 32 + 32 * 32 + 32 + 32 * 4 + 4)
    assert gradients == 2 * weights  # M = 4: a running sum beside one micro-batch's
    assert 2 * weights <= optimizer <= 2 * weights + 64  # Adam's moments and its counters
    assert activations == 4 * 8 * (32 + 32 + 4)  # each layer's output, 8 rows of float32
    assert in_flight == 2  # 1F1B's first stage of 2 holds 2 micro-batches
    table = memory_plan.format_rows([row]).splitlines()
    assert table[0].split()[:3] == ["process", "weights", "optimizer"]
    assert table[2].split()[0] == "CPU:0" and table[2].endswith("KiB")


def test_a_dense_whose_gradient_waits_for_the_step_holds_it_once_and_its_rows():
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((64,))
    h = keras.layers.Dense(64, activation="relu", name="d0")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(64, name="out")(h))
    # 4 rows a micro-batch, 16 a step: 16 x (64 + 64) kept < 64 x 64, for both layers.
    (row,) = _rows(model, "1f1b", microbatch_rows=4)
    _, weights, _, gradients, _, _ = row
    assert weights == 4 * 2 * (64 * 64 + 64)
    assert gradients == weights + 2 * 4 * 16 * (64 + 64)  # once, and each layer's rows
    (row,) = _rows(model, "zb", microbatch_rows=4)  # zero bubble keeps the running sums
    assert row[3] == 2 * weights
