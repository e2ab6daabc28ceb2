"""The shm all-reduce in buckets starts during the backward pass (#31), in one order on every rank.

The graph of a traced training step is read, not run (no second rank is
started: the communicator is a stand-in of size 2).
"""

from __future__ import annotations

import types

import pytest

from tfdist.shm import ops, runtime


@pytest.fixture
def traced(monkeypatch):
    """(graph, the kernels' gradient ops in layer order, the all-reduce ops in graph order)."""
    import keras
    import tensorflow as tf

    monkeypatch.setattr(runtime, "communicator",
                        lambda: types.SimpleNamespace(size=2, fusion_threshold_bytes=1 << 20))
    layers = [keras.layers.Dense(64, use_bias=False) for _ in range(4)]
    model = keras.Sequential([keras.Input((64,)), *layers])

    def step(bucket):
        names = []

        @tf.function
        def fn(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(x))
            grads = tape.gradient(loss, model.trainable_variables)
            names[:] = [g.op.name for g in grads]
            return ops.allreduce(grads, bucket_bytes=bucket)

        graph = fn.get_concrete_function(tf.TensorSpec([8, 64], tf.float32)).graph
        grads = [graph.get_operation_by_name(n) for n in names]
        reduces = [op for op in graph.get_operations() if "tfdist_shm_allreduce" in op.name
                   and op.type in ("PyFunc", "EagerPyFunc", "PyFuncStateless")]
        return graph, grads, reduces

    return step


def _ancestors(op):
    from tfdist.model_parallel.update_order import ancestors

    return ancestors([op])


def test_buckets_start_before_the_first_layers_gradient_exists(traced):
    _, grads, reduces = traced(64 * 64 * 4)  # one kernel a bucket
    assert len(reduces) == 4
    first, last = _ancestors(reduces[0]), _ancestors(reduces[-1])
    # The first all-reduce needs the last layer's gradient only: it can run while
    # the backward pass computes the first layers' (the executor starts it then).
    assert grads[3] in first and grads[0] not in first and grads[1] not in first
    assert grads[0] in last


def test_buckets_run_one_after_another(traced):
    _, _, reduces = traced(64 * 64 * 4)
    for before, after in zip(reduces, reduces[1:]):
        assert before in _ancestors(after)  # every rank: the same order


def test_no_bucket_is_one_all_reduce_after_the_whole_backward(traced):
    _, grads, reduces = traced(0)
    assert len(reduces) == 1
    assert set(grads) <= _ancestors(reduces[0])
