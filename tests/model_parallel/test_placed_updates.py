"""Each stage's optimizer work runs on the stage's device (a traced step, nothing run).

The fast tier has one logical CPU, so the second stage's device ("/cpu:1")
does not exist here: `check_devices` is told to accept it, soft placement
keeps the variables on CPU:0, and the traced graph still carries each op's
requested device, which is what these tests judge (a run with real stage
processes: tests/integration/test_pipeline_processes.py).
"""

from __future__ import annotations

DEVICES = ("/cpu:0", "/cpu:1")


def _graphs(graph):
    """`graph` and the graphs of every function it calls (cond branches), recursively."""
    out, stack = [], [graph]
    while stack:
        g = stack.pop()
        out.append(g)
        stack.extend(f.graph for f in getattr(g, "_functions", {}).values()
                     if getattr(f, "graph", None) is not None)
    return out


def _traced_step(monkeypatch, policy):
    """A 2-stage split of a 3-Dense model under `policy` (shape -> stage device, step graphs)."""
    import keras
    import tensorflow as tf

    from tfdist.model_parallel import pipeline, placement

    monkeypatch.setattr(placement, "check_devices", lambda devices: devices)
    before = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        keras.utils.set_random_seed(0)
        inputs = keras.Input((16,))
        h = keras.layers.Dense(24, activation="relu", name="d0")(inputs)
        h = keras.layers.Dense(40, activation="relu", name="d1")(h)
        model = keras.Model(inputs, keras.layers.Dense(4, name="out")(h))
        split = pipeline.split(model, list(DEVICES))
        split.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        graph = tf.function(lambda x, y: split.train_step((x, y))).get_concrete_function(
            tf.TensorSpec((8, 16)), tf.TensorSpec((8,), tf.int32)).graph
        where = {tuple(v.shape): DEVICES[s] for s in range(2)
                 for v in split.stages[s].variables}
    finally:
        keras.mixed_precision.set_global_policy(before)
    assert len(where) == 6 and set(where.values()) == set(DEVICES)  # every shape its own
    return where, _graphs(graph)


def _on(device):
    return "/device:" + device[1:].upper()  # "/cpu:1" -> "/device:CPU:1"


def test_loss_scaling_checks_and_unscales_each_gradient_on_its_stage_device(monkeypatch):
    # Keras's LossScaleOptimizer places neither: every stage's gradients went to
    # the caller (the chief) and back under --precision mixed_float16.
    where, graphs = _traced_step(monkeypatch, "mixed_float16")
    finite, unscaled = {}, {}
    for g in graphs:
        for op in g.get_operations():
            shape = tuple(op.inputs[0].shape) if op.inputs else None
            if op.type == "IsFinite" and shape in where:
                finite[shape] = op.device
            # The unscale: a gradient over the (scalar) loss scale.
            elif (op.type == "RealDiv" and shape in where
                  and op.inputs[1].shape.rank == 0):
                unscaled[shape] = op.device
    assert set(finite) == set(where) and set(unscaled) == set(where)
    for shape, device in where.items():
        assert finite[shape].endswith(_on(device)), (shape, finite[shape])
        assert unscaled[shape].endswith(_on(device)), (shape, unscaled[shape])
    # Each gradient's all(isfinite) is reduced on its device: only scalars reach the caller.
    stacked = [op for g in graphs for op in g.get_operations()
               if op.type == "Pack" and any(t.op.type == "All" for t in op.inputs)]
    assert stacked and all(t.op.device for op in stacked for t in op.inputs)
