"""The planner's short measured pass: each layer call's forward and backward halves, timed.

On one micro-batch, in this process (one intra-op thread, as a pinned stage
task runs): each layer call of the model, in `graph.keras_nodes` order (the
order the cuts index), runs under a tape of its own; its forward, its
inputs' gradient (I) and its weights' gradient (W) for an upstream gradient
of ones are each timed `repeats` times and the median kept. The bytes its
forward keeps are its outputs'; a layer's weights are counted at its first call.
"""

from __future__ import annotations

import statistics
import time

from tfdist.model_parallel.planner import LayerCost


def _timed(fn, repeats):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def layer_costs(model, inputs, repeats: int = 5) -> list[LayerCost]:
    """Each layer call's `LayerCost` on the micro-batch `inputs` (a list, `model.inputs` order).

    Args:
        model: A built functional Keras model.
        inputs: One micro-batch of the model's inputs.
        repeats: Timings of each part (the median is kept; the first run
            of each is a warm-up and not timed).
    """
    import numpy as np
    import tensorflow as tf
    from keras import tree

    from tfdist.model_parallel import graph as graph_lib

    known = {id(t): tf.convert_to_tensor(v) for t, v in zip(model.inputs, inputs)}
    counted, out = set(), []
    for node in graph_lib.keras_nodes(model):
        args, kwargs = node.arguments.fill_in(known)
        layer = node.operation
        ins = [known[id(t)] for t in dict.fromkeys(node.input_tensors)
               if known[id(t)].dtype.is_floating]

        def forward():
            with tf.GradientTape(persistent=True) as tape:
                tape.watch(ins)
                made = tree.flatten(layer(*args, **kwargs))
            return tape, made

        forward()
        forward_s, (tape, made) = _timed(forward, repeats)
        given = [tf.ones_like(t) for t in made]
        variables = list(layer.trainable_weights)

        def grad(sources):
            return lambda: [None if g is None else getattr(g, "values", g).numpy()
                            for g in tape.gradient(made, sources, output_gradients=given)]

        input_s = _timed(grad(ins), repeats)[0] if ins else 0.0
        weight_s = _timed(grad(variables), repeats)[0] if variables else 0.0
        weight_bytes = 0 if id(layer) in counted else sum(
            int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in layer.weights)
        counted.add(id(layer))
        out.append(LayerCost(forward_s, input_s, weight_s,
                             sum(int(np.prod(t.shape)) * t.dtype.size for t in made),
                             weight_bytes))
        for ref, value in zip(node.outputs, made):
            known[id(ref)] = value
    return out
