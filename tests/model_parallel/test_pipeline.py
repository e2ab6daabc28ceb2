"""The pipeline's traced train step, in-process on one device (its training: test_equality.py)."""

from __future__ import annotations

import pytest


def _ancestors(op):
    """Names of every op `op` waits for (inputs and control inputs, transitively)."""
    from tfdist.model_parallel.update_order import ancestors

    return {o.name for o in ancestors([op])}


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_stage_sums_each_micro_batchs_gradients_before_its_next_backward(schedule):
    # Kept until the schedule ended, M micro-batches' gradients were alive at once
    # (#29: 2 stage processes peaked at 0.95 of one process at M = 4).
    import keras
    import tensorflow as tf

    from tfdist.model_parallel import pipeline

    keras.utils.set_random_seed(0)
    inputs = keras.Input((16,))
    h = keras.layers.Dense(24, activation="relu", name="d0")(inputs)
    h = keras.layers.Dense(24, activation="relu", name="d1")(h)
    model = keras.Model(inputs, keras.layers.Dense(4, name="out")(h))
    split = pipeline.split(model, ["/cpu:0", "/cpu:0"], microbatches=3, schedule=schedule)
    split.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    graph = tf.function(lambda x, y: split.train_step((x, y))).get_concrete_function(
        tf.TensorSpec((48, 16)), tf.TensorSpec((48,), tf.int32)).graph
    # d1's kernel (24x24, a shape nothing else has): (g0 + g1) + g2, where the op
    # making g2 (micro-batch 2's backward) runs after the first sum.
    adds = [op for op in graph.get_operations() if op.type == "AddV2"
            and op.outputs[0].shape.as_list() == [24, 24]]
    assert len(adds) == 2
    second = next(op for op in adds if any(t.op in adds for t in op.inputs))
    first = next(op for op in adds if op is not second)
    g2 = next(t.op for t in second.inputs if t.op is not first)
    assert first.name in _ancestors(g2)


def _traced(microbatches, **optimizer):
    """A 3-Dense model in 2 stages (one device) under Adam: its train step's graph."""
    import keras
    import tensorflow as tf

    from tfdist.model_parallel import pipeline

    keras.utils.set_random_seed(0)
    inputs = keras.Input((16,))
    h = keras.layers.Dense(24, activation="relu", name="d0")(inputs)
    h = keras.layers.Dense(40, activation="relu", name="d1")(h)
    model = keras.Model(inputs, keras.layers.Dense(4, name="out")(h))
    split = pipeline.split(model, ["/cpu:0", "/cpu:0"], microbatches=microbatches)
    split.compile(optimizer=keras.optimizers.Adam(0.01, **optimizer),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return tf.function(lambda x, y: split.train_step((x, y))).get_concrete_function(
        tf.TensorSpec((8, 16)), tf.TensorSpec((8,), tf.int32)).graph


def _updates_before_kernel_gradient(graph, shape):
    """How many variable updates (AssignSub) the ops making the `shape` kernel's gradients
    (one a micro-batch) wait for, at most."""
    made = [op for op in graph.get_operations() if op.type == "MatMul"
            and op.name.startswith("gradient_tape/") and op.outputs[0].shape.as_list() == shape]
    assert made
    return max(sum(op.type == "AssignSubVariableOp" for op in graph.get_operations()
                   if op.name in _ancestors(m)) for m in made)


def test_at_one_micro_batch_a_stages_next_gradient_waits_for_the_previous_update():
    # Applied after the whole backward, a stage's gradients could all be alive
    # before its first update (#29: each stage process of 2 held about a stage's
    # gradients at its peak). Updates are chained per device; both stages are on
    # one device here, so one chain runs through the backward, which makes each
    # layer's bias gradient, then its kernel's, from the output layer back.
    graph = _traced(1)
    assert _updates_before_kernel_gradient(graph, [40, 4]) == 1  # out's bias
    assert _updates_before_kernel_gradient(graph, [24, 40]) == 3  # out's two, d1's bias
    assert _updates_before_kernel_gradient(graph, [16, 24]) == 5


def test_updates_that_need_every_gradient_keep_the_backward_unchained():
    # Global-norm clipping needs every gradient before any update: an edge
    # would be a cycle, so none is added (and the step still traces).
    assert _updates_before_kernel_gradient(_traced(1, global_clipnorm=1.0), [16, 24]) == 0
    assert _updates_before_kernel_gradient(_traced(2), [16, 24]) == 0  # M > 1: running sums
