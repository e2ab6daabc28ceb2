"""Pipeline parallelism: a model cut into stages on devices, fed with micro-batches.

`split` cuts a functional (or Sequential) Keras model between layer calls
(`tfdist.model_parallel.graph`): evenly in layers with weights at the cuts
that cross the fewest tensors (between the blocks of a Transformer, residuals
and all; the encoder output crossing into each decoder stage), or where
`--placement` says. Layers without weights stay with the layer before them.

`PipelineModel` trains the stages: its `train_step` splits each batch into M
equal micro-batches and runs a schedule (`tfdist.model_parallel.schedules`:
GPipe or 1F1B), a list of forward and backward actions per stage, each under
its stage's device with a tape of its own (`output_gradients` carry the
gradient back across a cut), each stage's actions in the schedule's order
(control dependencies). Gradients are summed over micro-batches in
micro-batch order, whatever the schedule, and applied once per batch. With
M = 1 it is naive model parallelism (one stage busy at a time).

Equality with unsplit training: the loss of a batch is the mean of the equal
micro-batches' mean losses, so each micro-batch's loss is scaled by 1/M and
the summed gradients equal the full batch's.
"""

from __future__ import annotations

import functools

from tfdist.errors import ConfigError
from tfdist.model_parallel import graph as graph_lib
from tfdist.model_parallel import placement as placement_lib
from tfdist.model_parallel import plan, schedules


def _add(a, b):
    """a + b for gradients: IndexedSlices (an Embedding's) are concatenated, not densified."""
    import tensorflow as tf

    if a is None or b is None:
        return b if a is None else a
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
        return tf.IndexedSlices(tf.concat([a.values, b.values], 0),
                                tf.concat([a.indices, b.indices], 0), dense_shape=a.dense_shape)
    return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)


def _dense(t):
    """A tensor a control dependency can name (an IndexedSlices' values)."""
    return getattr(t, "values", t)


def _update_where_the_variable_lives(optimizer) -> None:
    """Runs each variable's update (say, Adam's moment arithmetic) on that variable's device.

    Keras's TensorFlow optimizer places no update (the default strategy's
    `extended.update` sets no device), so every update ran on the device of the
    caller: with stages in other processes, each of their gradients and slots
    travelled to the chief and back, and the chief's memory grew with the whole
    model's. Wraps the optimizer's `update_step` (and its one-replica
    all-reduce) once; the math is unchanged.
    """
    import keras
    import tensorflow as tf

    inner = getattr(optimizer, "inner_optimizer", optimizer)  # a LossScaleOptimizer's
    if getattr(inner, "_tfdist_placed_updates", False):
        return
    update = inner.update_step

    def placed(gradient, variable, learning_rate):
        # Keras hands over its variables' tf.Variables (`.value` would be a method).
        held = variable.value if isinstance(variable, keras.Variable) else variable
        with tf.device(held.device):
            return update(gradient, variable, learning_rate)

    all_reduce = inner._all_reduce_sum_gradients

    def one_replica(grads_and_vars):
        # One replica has nothing to sum, but the default strategy's all_reduce
        # still passes every gradient through an IdentityN with no device, which
        # put each stage's gradients on the caller's device and back.
        if tf.distribute.get_strategy().num_replicas_in_sync == 1:
            return list(grads_and_vars)
        return all_reduce(grads_and_vars)

    inner.update_step = placed
    inner._all_reduce_sum_gradients = one_replica
    inner._tfdist_placed_updates = True


@functools.lru_cache(maxsize=None)
def _model_class():
    import keras
    import tensorflow as tf
    from keras import tree

    class PipelineModel(keras.Model):
        """A placed copy of a model, cut into stages, trained with a pipeline schedule.

        Args:
            inner: The placed copy (`placement.placed_clone`), a plain Keras model.
            stage_of: layer name -> stage index.
            stage_devices: The device of each stage, or its tuple of devices
                when the stage is tensor-parallel (it runs under the first).
            microbatches: Micro-batches per batch (M); the batch must divide by it.
            schedule: "gpipe" or "1f1b".
        """

        def __init__(self, inner, stage_of, stage_devices, microbatches=1, schedule="gpipe",
                     **kwargs):
            super().__init__(**kwargs)
            plan.microbatch_size(int(microbatches), 1)  # validates microbatches >= 1
            self.inner = inner
            self.microbatches = int(microbatches)
            self.schedule_name = schedule
            self.stage_groups = [(d,) if isinstance(d, str) else tuple(d) for d in stage_devices]
            self.stage_devices = [group[0] for group in self.stage_groups]
            self._graph = graph_lib.from_keras(inner)
            self._nodes = graph_lib.keras_nodes(inner)
            cuts = graph_lib.cuts_of(self._graph, stage_of)
            self._bounds = [0, *cuts, len(self._nodes)]
            p = len(self.stage_devices)
            self.schedule = schedules.build(schedule, p, self.microbatches)
            layers = {layer.name: layer for layer in inner.layers}
            self.stage_layers = [
                list(dict.fromkeys(layers[n.layer] for n in self._graph.nodes[a:b]))
                for a, b in zip(self._bounds, self._bounds[1:])]
            self.pipeline_layers = [layer for stage in self.stage_layers for layer in stage]
            self.stage_sizes = [len(stage) for stage in self.stage_layers]
            ids = {id(v) for v in inner.trainable_variables}
            self._stage_variables = [
                [v for layer in stage for v in layer.trainable_weights if id(v) in ids]
                for stage in self.stage_layers]
            self.built = True

        def compile(self, *args, **kwargs):
            """Keras's compile; refuses per-variable `clipnorm` on tensor-parallel layers.

            Raises:
                ConfigError: `clipnorm` would clip each shard by its own norm.
            """
            super().compile(*args, **kwargs)
            _update_where_the_variable_lives(self.optimizer)
            from tfdist.model_parallel import tensor_parallel

            inner = getattr(self.optimizer, "inner_optimizer", self.optimizer)
            split = [layer.name for layer in self.pipeline_layers
                     if tensor_parallel.is_tensor_parallel(layer)]
            if getattr(inner, "clipnorm", None) and split:
                raise ConfigError(
                    f"The optimizer clips each variable by its own norm (clipnorm="
                    f"{inner.clipnorm}), but tensor-parallel layers ({split[0]!r} and "
                    f"{len(split) - 1} more) hold each weight as shards, so each shard would "
                    "be clipped alone. Use global_clipnorm (tfdist's --clipnorm is global), "
                    "or no tensor parallelism.")

        def stage(self, s):
            """The layers of stage `s`."""
            return self.stage_layers[s]

        def crossing(self, s):
            """Ids of the tensors stage `s` takes (the tensors crossing its first cut)."""
            return self._graph.crossing(self._bounds[s])

        def run_stage(self, s, values, training=None):
            """Stage `s` forward on its device: its input tensors -> its output tensors.

            `values` is a list aligned with `crossing(s)`, or a single tensor
            when exactly one tensor crosses; so is the result.
            """
            single = not isinstance(values, (list, tuple))
            values = [values] if single else list(values)
            known = dict(zip(self.crossing(s), values))
            a, b = self._bounds[s], self._bounds[s + 1]
            with tf.device(self.stage_devices[s]):
                for node in self._nodes[a:b]:
                    args, kwargs = node.arguments.fill_in(known)
                    layer = node.operation
                    if training is not None and "training" in getattr(
                            layer, "_call_context_args", {}):
                        kwargs["training"] = training
                    out = layer(*args, **kwargs)
                    for ref, value in zip(node.outputs, tree.flatten(out)):
                        known[id(ref)] = value
            out_ids = (self._graph.crossing(b) if s + 1 < len(self.stage_devices)
                       else list(self._graph.outputs))
            result = [known[i] for i in out_ids]
            return result[0] if single and len(result) == 1 else result

        def _inputs(self, x):
            """The model's input tensors as a list in `inner.inputs` order (dicts by name)."""
            if isinstance(x, dict):
                return [x[t.name] for t in self.inner.inputs]
            return tree.flatten(x)

        def _pack(self, values):
            """Output tensors in the structure the unsplit model returns."""
            structure = getattr(self.inner, "_outputs_struct", self.inner.outputs)
            return tree.pack_sequence_as(structure, list(values))

        def call(self, x, training=None):
            values = self._inputs(x)
            for s in range(len(self.stage_devices)):
                values = self.run_stage(s, list(values), training=training)
            return self._pack(values)

        def train_step(self, data):
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
            m, p = self.microbatches, len(self.stage_devices)
            split = lambda t: tf.split(t, m) if t is not None else [None] * m  # noqa: E731
            flat = [split(t) for t in self._inputs(x)]
            xs = [[parts[i] for parts in flat] for i in range(m)]
            ys = [tree.map_structure(lambda t, i=i: split(t)[i], y) for i in range(m)]
            sws = [None] * m if sample_weight is None else [
                tree.map_structure(lambda t, i=i: split(t)[i], sample_weight) for i in range(m)]
            tapes, ins, outs, targets = {}, {}, {}, {}
            upstream, grads = {}, {}
            losses, preds = [None] * m, [None] * m
            last = [[] for _ in range(p)]  # each stage's previous action, to keep the order
            for s, kind, i in schedules.order(self.schedule):
                with tf.device(self.stage_devices[s]), tf.control_dependencies(last[s]):
                    if kind == "F":
                        h = xs[i] if s == 0 else outs[(i, s - 1)]
                        with tf.GradientTape() as tape:
                            if s > 0:  # the model's own inputs (maybe tokens) need no gradient
                                tape.watch([t for t in h if t.dtype.is_floating])
                            out = self.run_stage(s, list(h), training=True)
                            if s == p - 1:
                                pred = self._pack(out)
                                losses[i] = self._compute_loss(
                                    x=xs[i], y=ys[i], y_pred=pred, sample_weight=sws[i],
                                    training=True)
                                preds[i] = pred
                                # Mean of equal micro-batch means; scaled under mixed_float16.
                                targets[(i, s)] = [self.optimizer.scale_loss(losses[i] / m)]
                        tapes[(i, s)], ins[(i, s)], outs[(i, s)] = tape, h, out
                        last[s] = tree.flatten(out)
                    else:
                        grads[(i, s)], upstream[(i, s - 1)] = self._backward(
                            s, tapes.pop((i, s)), ins.pop((i, s)),
                            targets.pop((i, s), None) or outs[(i, s)],
                            upstream.pop((i, s), None))
                        last[s] = [_dense(g) for g in grads[(i, s)] if g is not None]
            gradients, variables = [], []
            for s in range(p):
                with tf.device(self.stage_devices[s]):  # where the stage's gradients are
                    for k, v in enumerate(self._stage_variables[s]):
                        total = None
                        for i in range(m):  # micro-batch order, whatever the schedule
                            total = _add(total, grads[(i, s)][k])
                        gradients.append(total)
                        variables.append(v)
            order = {id(v): n for n, v in enumerate(self.inner.trainable_variables)}
            pairs = sorted(zip(gradients, variables), key=lambda gv: order[id(gv[1])])
            self.optimizer.apply([g for g, _ in pairs], [v for _, v in pairs])
            with tf.device(self.stage_devices[-1]):
                y_pred = tree.map_structure(lambda *t: tf.concat(t, axis=0), *preds)
            self._loss_tracker.update_state(tf.add_n(losses) / m,
                                            sample_weight=tf.shape(self._inputs(x)[0])[0])
            return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

        def _backward(self, s, tape, inputs, targets, upstream):
            """Stage `s`'s backward: (its variables' gradients, its inputs' gradients)."""
            given = None
            if s < len(self.stage_devices) - 1:  # the outputs a later stage sent a gradient for
                kept = [(t, g) for t, g in zip(targets, upstream or []) if g is not None]
                targets, given = [t for t, _ in kept], [g for _, g in kept]
            floating = [t for t in inputs if t.dtype.is_floating] if s > 0 else []
            variables = self._stage_variables[s]
            if not targets:
                return [None] * len(variables), [None] * len(inputs)
            g = tape.gradient(targets, [*floating, *variables], output_gradients=given)
            into, rest = iter(g[:len(floating)]), g[len(floating):]
            into_inputs = [next(into) if (s > 0 and t.dtype.is_floating) else None
                           for t in inputs]
            return list(rest), into_inputs

        def save(self, filepath, *args, **kwargs):
            """Saves the plain model, unsplit and shards gathered (it loads without tfdist)."""
            from tfdist.model_parallel import tensor_parallel

            return tensor_parallel.gather_model(self.inner).save(filepath, *args, **kwargs)

        def unsplit(self):
            """The Keras model sharing these layers and variables (tensor-parallel
            layers stay split; `tensor_parallel.gather_model` makes it plain)."""
            return self.inner

    return PipelineModel


def split(model, devices: list[str] | None = None, placement: str = "", microbatches: int = 1,
          schedule: str = "gpipe", tensor_parallel: int = 1):
    """Cuts a model into placed stages trained with micro-batches, each maybe tensor-parallel.

    Args:
        model: A built functional or Sequential Keras model.
        devices: Devices for an even split (one stage each) at the cuts that
            cross the fewest tensors.
        placement: Instead of `devices`, "a,b=/cpu:0;c=/cpu:1": contiguous
            layer groups in model order, one stage per group. Layers without
            weights go with the layer before them in both cases.
        microbatches: M, micro-batches per batch; M = 1 is naive model parallelism.
        schedule: "gpipe" or "1f1b".
        tensor_parallel: T, devices per stage: stage s runs on
            devices[s*T:(s+1)*T] (so `devices` holds P*T for P stages), its
            attention layers split by heads and its feed-forward Dense pairs
            by units over them (`tensor_parallel`), its other layers on the
            first. T = 1: each stage on one device.

    Returns:
        A `PipelineModel` (uncompiled) starting from `model`'s weights.

    Raises:
        ConfigError: for a model that cannot be cut, a bad placement, a missing device.
    """
    schedules.build(schedule, 1, 1)  # the name, before any work
    t = plan.check_tensor_parallel(len(devices or []), tensor_parallel, bool(placement))
    graph = graph_lib.from_keras(model)
    if placement:
        groups = plan.parse_placement(placement)
        cuts = graph_lib.stages_from_groups(graph, [names for _, names in groups])
        stage_devices = [device for device, _ in groups]
    else:
        if not devices:
            raise ConfigError("Model parallelism needs devices: pass --devices N (at least 2) "
                              "or --placement 'layer_a=/cpu:0;layer_b=/cpu:1'.")
        groups = [tuple(devices[s * t:(s + 1) * t]) for s in range(len(devices) // t)]
        cuts = graph_lib.balanced_cuts(graph, len(groups))
        stage_devices = groups if t > 1 else list(devices)
    bounds = [0, *cuts, len(graph.nodes)]
    stage_of = {}
    for s, (a, b) in enumerate(zip(bounds, bounds[1:])):
        for node in graph.nodes[a:b]:
            if stage_of.setdefault(node.layer, s) != s:
                raise ConfigError(
                    f"Layer {node.layer!r} is called in stage {stage_of[node.layer]} and stage "
                    f"{s}; a shared layer's weights live on one device. Keep its calls in one "
                    "stage (--placement), or use a data-parallel strategy.")
    inner = placement_lib.placed_clone(
        model, {name: stage_devices[s] for name, s in stage_of.items()})
    return _model_class()(inner, stage_of, stage_devices, microbatches, schedule,
                          name=model.name)


def pipeline_model_class():
    """The `PipelineModel` class (defined lazily, so importing this module needs no Keras)."""
    return _model_class()
