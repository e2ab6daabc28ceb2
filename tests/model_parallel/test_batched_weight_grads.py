"""Dense weight gradients taken once a step over the micro-batches (#50, batched_weight_grads)."""

from __future__ import annotations

import numpy as np
import pytest

from tfdist.model_parallel import batched_weight_grads as bwg


def test_batching_pays_where_the_kernel_outweighs_the_rows_kept():
    assert bwg.worth_batching(256, 2048, 2048)  # #50's model: 1 M floats kept vs 4 M
    assert bwg.worth_batching(2048, 4096, 4096)
    assert not bwg.worth_batching(32768, 256, 256)  # activations outweigh the kernel
    assert not bwg.worth_batching(None, 2048, 2048)  # rows unknown to the trace


def test_only_a_plain_dense_on_its_stored_weights_is_batched():
    import keras

    class Scaled(keras.layers.Dense):
        def call(self, inputs):
            return 2 * super().call(inputs)

    assert bwg.plain_dense(keras.layers.Dense(4))
    assert not bwg.plain_dense(Scaled(4))  # its own call: its ops are not Dense.call's
    assert not bwg.plain_dense(keras.layers.Dense(4, dtype="mixed_float16"))  # autocast
    assert not bwg.plain_dense(keras.layers.EinsumDense("ab,bc->ac", 4))
    assert not bwg.plain_dense(keras.layers.Dense(4, kernel_regularizer="l2"))
    assert not bwg.plain_dense(keras.layers.Dense(4, activity_regularizer="l1"))


def _model(keras):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((64,))
    h = keras.layers.Dense(64, activation="tanh", name="d0")(inputs)
    h = keras.layers.Dense(64, activation="tanh", name="d1")(h)
    return keras.Model(inputs, keras.layers.Dense(64, name="out")(h))


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(48, 64)).astype("float32"), rng.integers(0, 64, 48)


def _loss(keras):
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@pytest.mark.parametrize("schedule, per_kernel", [("gpipe", 1), ("1f1b", 1), ("zb", 4)])
def test_a_wide_kernels_gradient_is_one_matmul_over_the_whole_batch(schedule, per_kernel):
    import keras
    import tensorflow as tf

    from tfdist.model_parallel import pipeline
    from tfdist.model_parallel.update_order import ancestors

    split = pipeline.split(_model(keras), ["/cpu:0", "/cpu:0"], microbatches=4,
                           schedule=schedule)
    split.compile(optimizer=keras.optimizers.SGD(0.1), loss=_loss(keras))
    graph = tf.function(lambda x, y: split.train_step((x, y))).get_concrete_function(
        tf.TensorSpec((16, 64)), tf.TensorSpec((16,), tf.int32)).graph
    # 16 rows x (64 + 64) kept < 64 x 64: each of the 3 kernels' gradients is one
    # matmul of the batch's 16 rows, not 4 of 4 rows added up; zero bubble keeps its
    # W a micro-batch (to run each in a bubble). (The tape's own kernel-gradient ops
    # are in the graph too, but nothing that runs waits for them.)
    updates = [op for op in graph.get_operations() if op.type.startswith("Assign")]
    run = {op.name for op in ancestors(updates)}
    kernel_grads = [op for op in graph.get_operations() if op.type == "MatMul"
                    and op.name in run and op.outputs[0].shape.as_list() == [64, 64]]
    assert len(kernel_grads) == 3 * per_kernel, [op.name for op in kernel_grads]
    assert all(op.inputs[0].shape.as_list()[0] == 16 // per_kernel for op in kernel_grads)


@pytest.mark.parametrize("schedule", ["1f1b", "zb"])
def test_batched_pipeline_steps_equal_one_process(schedule):
    import keras

    from tfdist.model_parallel import pipeline

    x, y = _data()
    plain = _model(keras)
    plain.compile(optimizer=keras.optimizers.Adam(0.01), loss=_loss(keras))
    plain.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    split = pipeline.split(_model(keras), ["/cpu:0", "/cpu:0"], microbatches=4,
                           schedule=schedule)
    split.compile(optimizer=keras.optimizers.Adam(0.01), loss=_loss(keras))
    split.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    moved = max(float(np.abs(a - b).max())
                for a, b in zip(plain.get_weights(), _model(keras).get_weights()))
    assert moved > 1e-2  # 3 Adam steps trained
    for a, b in zip(split.unsplit().get_weights(), plain.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_kernel_gradients_taken_at_the_steps_end_are_applied_one_after_another():
    # Made once a step, after the stage's last backward, each waits for the update of
    # the one made before it on its device (update_order): one is alive at a time.
    import keras
    import tensorflow as tf

    from tfdist.model_parallel import pipeline
    from tfdist.model_parallel.update_order import ancestors

    split = pipeline.split(_model(keras), ["/cpu:0", "/cpu:0"], microbatches=4)
    split.compile(optimizer=keras.optimizers.Adam(0.01), loss=_loss(keras))
    graph = tf.function(lambda x, y: split.train_step((x, y))).get_concrete_function(
        tf.TensorSpec((16, 64)), tf.TensorSpec((16,), tf.int32)).graph
    made = [op for op in graph.get_operations() if op.type == "MatMul"
            and "batched_weight_grads" in op.name]
    waits = sorted(sum(a.type == "AssignSubVariableOp" for a in ancestors([op]))
                   for op in made)
    # d0's kernel first; d1's after d0's kernel and bias; out's after d1's as well.
    assert waits == [0, 2, 4]


def test_the_row_arithmetic_agrees_with_itself():
    assert bwg.call_rows((8, 5, 64)) == 40  # a Dense on (batch, time, features)
    assert bwg.call_rows((None, 64)) is None
    most = bwg.most_microbatches(4, 64, 64)
    assert most == 8 and bwg.worth_batching(4 * most, 64, 64)
    assert not bwg.worth_batching(4 * (most + 1), 64, 64)
    assert bwg.most_microbatches(None, 64, 64) == 0
    assert bwg.in_schedule([[("F", 0), ("B", 0)]], 4)
    assert not bwg.in_schedule([[("F", 0), ("I", 0), ("W", 0)]], 4)  # zero bubble
    assert not bwg.in_schedule([[("F", 0), ("B", 0)]], 1)
