"""The pipeline's traced train step, in-process on one device (its training: test_equality.py)."""

from __future__ import annotations

import pytest


def _ancestors(op):
    """Names of every op `op` waits for (inputs and control inputs, transitively)."""
    seen, stack = set(), [op]
    while stack:
        o = stack.pop()
        for parent in [t.op for t in o.inputs] + list(o.control_inputs):
            if parent.name not in seen:
                seen.add(parent.name)
                stack.append(parent)
    return seen


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
