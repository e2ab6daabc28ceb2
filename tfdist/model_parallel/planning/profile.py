"""The planner's short measured pass: each layer call's forward and backward halves, timed.

On one micro-batch, in this process (one intra-op thread, as a pinned stage
task runs): each layer call of the model, in `graph.keras_nodes` order (the
order the cuts index), is traced three ways as a `tf.function` (as the
pipeline's train step runs it, without eager overhead): its forward alone,
its forward and inputs' gradient, its forward and weights' gradient (for an
upstream gradient of ones). Each is timed `repeats` times (the median kept);
I and W are the latter two less the forward. The bytes its forward keeps
are its outputs'; a layer's weights are counted at its first call, where
their Adam update (`_update_s`) and the add of their gradients into the
step's running sum (`_accumulate_s`) are timed too. `action_s` times what
an action costs whatever its work.

Each layer is timed as a fresh copy made from its config (and dropped after
its last call), so a model built without values (the chief of stage
processes, `deferred`) can be measured one layer at a time, and the model
itself is left untouched: its layers' state (a Dropout's seed) and Python's
random state (from which a copy's seeds are drawn) are as they were.
"""

from __future__ import annotations

import random
import statistics
import time

from tfdist.model_parallel.planning.planner import LayerCost


def _timed(fn, repeats):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def _extra_s(short, long, repeats) -> float:
    """How much longer `long` takes than `short` (medians), at least 0: the two timed
    alternately in one loop, so a slow spell of a shared machine falls on both."""
    pairs = [(_timed(short, 1)[0], _timed(long, 1)[0]) for _ in range(repeats)]
    return max(statistics.median(b for _, b in pairs) - statistics.median(a for a, _ in pairs),
               0.0)


def sample_inputs(model, rows: int) -> list:
    """One micro-batch of `rows` rows for each of `model.inputs`: normal floats, zero ids."""
    import numpy as np

    rng = np.random.default_rng(0)
    return [rng.normal(size=(rows, *t.shape[1:])).astype(t.dtype) if "float" in str(t.dtype)
            else np.zeros((rows, *t.shape[1:]), t.dtype) for t in model.inputs]


def _fresh(layer):
    """A copy of `layer` from its config (built at its first call), or `layer` itself
    when it cannot be copied and holds its values."""
    from tfdist.errors import ConfigError
    from tfdist.model_parallel import deferred

    try:
        return layer.__class__.from_config(layer.get_config())
    except Exception as e:  # a user's layer class: measured as it is where it can be
        if not any(deferred.is_deferred(v) for v in layer.weights):
            return layer
        raise ConfigError(f"The planner cannot time layer {layer.name!r}: it cannot be copied "
                          f"from its config ({type(e).__name__}). Drop --schedule auto and "
                          "--balance time, or give the layer a get_config() its constructor "
                          "accepts.") from None


def layer_costs(model, inputs, repeats: int = 11) -> list[LayerCost]:
    """Each layer call's `LayerCost` on the micro-batch `inputs` (a list, `model.inputs` order).

    Args:
        model: A built functional Keras model.
        inputs: One micro-batch of the model's inputs.
        repeats: Timings of each part (the median is kept; the first run
            of each is a warm-up and not timed).
    """
    import tensorflow as tf

    from tfdist.model_parallel import graph as graph_lib

    known = {id(t): tf.convert_to_tensor(v) for t, v in zip(model.inputs, inputs)}
    counted, out, copies = set(), [], {}
    nodes = graph_lib.keras_nodes(model)
    last = {id(node.operation): k for k, node in enumerate(nodes)}
    seeds = random.getstate()
    try:
        for k, node in enumerate(nodes):
            out.append(_node_cost(node, known, copies, counted, repeats))
            if last[id(node.operation)] == k:
                copies.pop(id(node.operation), None)  # one layer's weights at a time
    finally:
        random.setstate(seeds)
    return out


def _node_cost(node, known, copies, counted, repeats) -> LayerCost:
    """One layer call's `LayerCost`; its outputs go into `known` for the next calls."""
    import numpy as np
    import tensorflow as tf
    from keras import tree

    args, kwargs = node.arguments.fill_in(known)
    original = node.operation
    if id(original) not in copies:
        copies[id(original)] = _fresh(original)
    layer = copies[id(original)]
    made = tree.flatten(layer(*args, **kwargs))  # builds a fresh copy, eagerly
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
    forward_s = timed["F"]
    input_s, weight_s = (max(timed[k] - forward_s, 0.0) for k in ("I", "W"))
    first = id(original) not in counted
    weight_bytes = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
                       for v in layer.weights) if first else 0
    update_s = _update_s(variables, repeats) if first and variables else 0.0
    accumulate_s = _accumulate_s(variables, repeats) if first and variables else 0.0
    counted.add(id(original))
    for ref, value in zip(node.outputs, made):
        known[id(ref)] = value
    return LayerCost(forward_s, input_s, weight_s,
                     sum(int(np.prod(t.shape)) * t.dtype.size for t in made),
                     weight_bytes, update_s, accumulate_s,
                     batched_upto(original, args) if first else 0)


def batched_upto(layer, args) -> int:
    """The most micro-batches (of the profiled rows) at which a call of `layer` on
    `args` has its weight gradient taken once a step (`batched_weight_grads`); 0: never."""
    from tfdist.model_parallel import batched_weight_grads as bwg

    if len(args) != 1 or not bwg.plain_dense(layer):
        return 0
    return bwg.most_microbatches(bwg.call_rows(args[0].shape), *bwg.units(layer))


def _update_s(variables, repeats) -> float:
    """One Adam update of `variables` (the planner's optimizer; they are the layer's fresh
    copy's, dropped after)."""
    import keras
    import tensorflow as tf

    optimizer = keras.optimizers.Adam()
    optimizer.build(variables)
    grads = [tf.zeros(v.shape, v.dtype) for v in variables]
    fn = tf.function(lambda: optimizer.apply(grads, variables))
    fn()  # traced, not timed
    return _timed(fn, repeats)[0]


def _accumulate_s(variables, repeats) -> float:
    """One add of a micro-batch's gradients of `variables` into the step's running sum.

    The pipeline adds each micro-batch's gradients after the first to a sum
    (`pipeline_model.PipelineModel._run_schedule`), in the action that made them, and the
    device's next action waits for the sum (a control dependency). The sum
    is a temporary the add may overwrite, which TensorFlow does (no new
    buffer). So it is timed as the graph of two such adds, a + b and then,
    after it, that sum + c, less the graph of the first alone: the second add
    is the running sum's, and the first's new buffer cancels. (Written
    (a + b) + c, Grappler makes one AddN of it, cheaper than the pipeline's.)
    """
    import tensorflow as tf

    def two_adds(a, b, c):
        sums = [x + y for x, y in zip(a, b)]
        with tf.control_dependencies(sums):  # as `_run_schedule`'s next action waits
            return [s + z for s, z in zip(sums, c)]

    a, b, c = ([tf.ones(v.shape, v.dtype) for v in variables] for _ in range(3))
    once = tf.function(lambda a, b, c: [x + y for x, y in zip(a, b)])
    twice = tf.function(two_adds)
    once(a, b, c), twice(a, b, c)  # traced, not timed
    return _extra_s(lambda: once(a, b, c), lambda: twice(a, b, c), repeats)


def action_s(repeats: int = 11, actions: int = 256) -> float:
    """The fixed cost of one pipeline action, whatever its work: seconds, at least 0.

    The pipeline's train step is one graph (`pipeline_model.PipelineModel._run_schedule`):
    each action is a few ops under its stage's device and a control dependency on
    its device's previous action, run by TensorFlow's executor. So the cost an
    action pays beyond its layers' is the executor's for its ops and that control
    edge, not a `tf.function` call (the layers' own timings each include one call;
    the step makes one). It is timed as the graph of `actions` chained actions
    doing almost nothing (two ops on a scalar), less the graph of one: the slope
    per action, with the call's own cost cancelled.

    Args:
        repeats: Timings of each graph (the median kept; a warm-up run first).
        actions: Actions in the long chain.
    """
    import tensorflow as tf

    def chain(n):
        def run(x, y):
            last = []
            for _ in range(n):
                with tf.control_dependencies(last):  # as `_run_schedule` orders a device's
                    # Not a chain of adds, which Grappler turns into one AddN; `y` is an
                    # argument, so no constant folding either.
                    x = tf.sin(x) * y
                last = [x]
            return x
        return tf.function(run)

    x, y = tf.constant(0.0), tf.constant(1.0)
    one, many = chain(1), chain(actions)
    one(x, y), many(x, y)  # traced, not timed
    return _extra_s(lambda: one(x, y), lambda: many(x, y), repeats) / (actions - 1)
