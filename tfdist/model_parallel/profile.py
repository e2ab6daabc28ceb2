"""The planner's short measured pass: each layer call's forward and backward halves, timed.

On one micro-batch, in this process (one intra-op thread, as a pinned stage
task runs): each layer call of the model, in `graph.keras_nodes` order (the
order the cuts index), is traced three ways as a `tf.function` (as the
pipeline's train step runs it, without eager overhead): its forward alone,
its forward and inputs' gradient, its forward and weights' gradient (for an
upstream gradient of ones). Each is timed `repeats` times (the median kept);
I and W are the latter two less the forward. The bytes its forward keeps
are its outputs'; a layer's weights are counted at its first call.
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


def layer_costs(model, inputs, repeats: int = 11) -> list[LayerCost]:
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

        variables = list(layer.trainable_weights)

        def part(sources):
            def run():
                with tf.GradientTape() as tape:
                    tape.watch(ins)
                    made = tree.flatten(layer(*args, **kwargs))
                if sources is None:
                    return made
                grads = tape.gradient(made, sources,
                                      output_gradients=[tf.ones_like(t) for t in made])
                return [getattr(g, "values", g) for g in grads if g is not None]
            return tf.function(run)

        timed = {}
        for key, sources in (("F", None), ("I", ins), ("W", variables)):
            if key != "F" and not sources:
                timed[key] = timed["F"]
                continue
            fn = part(sources)
            fn()  # traced, not timed
            timed[key] = _timed(fn, repeats)[0]
        made = tree.flatten(layer(*args, **kwargs))
        forward_s = timed["F"]
        input_s, weight_s = (max(timed[k] - forward_s, 0.0) for k in ("I", "W"))
        weight_bytes = 0 if id(layer) in counted else sum(
            int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in layer.weights)
        counted.add(id(layer))
        out.append(LayerCost(forward_s, input_s, weight_s,
                             sum(int(np.prod(t.shape)) * t.dtype.size for t in made),
                             weight_bytes))
        for ref, value in zip(node.outputs, made):
            known[id(ref)] = value
    return out
