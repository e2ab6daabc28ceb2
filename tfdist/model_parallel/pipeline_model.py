"""`PipelineModel`: a placed copy of a model, cut into stages, trained with a pipeline schedule.

`tfdist.model_parallel.pipeline.split` cuts a model and builds one; this
module holds the Keras model class itself (it imports Keras and TensorFlow,
which `pipeline`'s planning does not need), its train step
(`_run_schedule`: each device's actions in the schedule's order, each run by its
stage's `stage_step.StageStep`, which adds the stage's gradients to its running sum
as its backward makes them) and the
stages of each data-parallel copy (`stages_of`).
"""

from __future__ import annotations

import functools

import keras
import tensorflow as tf
from keras import tree

from tfdist.errors import ConfigError
from tfdist.model_parallel import graph as graph_lib
from tfdist.model_parallel import (batched_weight_grads, placed_updates, schedules,
                                   stage_step, surgery, update_order)
from tfdist.model_parallel import stage as stage_lib

_add = stage_lib.add_gradients


def stages_of(copy, split_plan, groups):
    """The `Stage`s of one placed copy of the model, cut as `split_plan` says."""
    nodes = graph_lib.keras_nodes(copy)
    graph = graph_lib.from_keras(copy, nodes)
    if tuple(n.layer for n in graph.nodes) != split_plan.layers:
        raise ConfigError(f"A copy of model {copy.name!r} calls its layers in another order "
                          "than the model it was cut from; it cannot take the same stages.")
    return [stage_lib.Stage(s, graph, nodes, split_plan.bounds, copy, devices)
            for s, devices in enumerate(groups)]


class PipelineModel(keras.Model):
    """A placed copy of a model, cut into stages, trained with a pipeline schedule.

    Args:
        inner: The placed copy (`surgery.placed_clone`), a plain Keras model.
        stage_of: layer name -> stage index.
        stage_devices: The device of each stage, or its tuple of devices
            when the stage is tensor-parallel (it runs under the first).
        microbatches: Micro-batches per batch (M); the batch must divide by it.
        schedule: One of `schedules.NAMES`.
        virtual: V, chunks a device holds (interleaved); the plan has P·V stages.
    """

    def __init__(self, inner, plan, microbatches=1, schedule="gpipe", copies=(),
                 virtual=1, **kwargs):
        super().__init__(**kwargs)
        self.inner = inner
        self.microbatches = int(microbatches)
        self.schedule_name = schedule
        self.virtual_stages = int(virtual)
        self.schedule = schedules.build(schedule, plan.num_stages // self.virtual_stages,
                                        self.microbatches, self.virtual_stages)
        # Copy 0 is `inner`; the others (data-parallel copies of the pipeline) are
        # kept out of Keras's tracking (set past its `__setattr__`), so the model's
        # variables, its backups and its optimizer's slots are copy 0's alone.
        untracked = functools.partial(object.__setattr__, self)
        untracked("plan", plan)
        untracked("_copies", [inner, *copies])
        untracked("pipelines", [stages_of(copy, plan, groups)
                                for copy, groups in zip(self._copies, plan.copy_groups)])
        self.stage_groups = list(plan.copy_groups[0])
        self.stage_devices = [stage.device for stage in self.stages]
        # Tracked as before the Stage class (the same layers and variables, in the
        # same order), so `model.variables`, and so backups, keep their order.
        self.stage_layers = [stage.layers for stage in self.stages]
        self.pipeline_layers = [layer for stage in self.stage_layers for layer in stage]
        self.stage_sizes = [len(stage) for stage in self.stage_layers]
        self._stage_variables = [stage.variables for stage in self.stages]
        self.built = True

    @property
    def stages(self):
        """Copy 0's `Stage`s, in pipeline order."""
        return self.pipelines[0]

    @property
    def num_copies(self) -> int:
        """Data-parallel copies of the pipeline (1: none)."""
        return len(self._copies)

    def copy_devices(self, c):
        """The stage devices of copy `c`."""
        return [stage.device for stage in self.pipelines[c]]

    def sync_copies(self):
        """Gives every copy copy 0's weights (after a backup was restored into copy 0)."""
        for c in range(1, self.num_copies):
            self._assign_from_first(c)

    def _assign_from_first(self, c):
        for mine, first in zip(self.pipelines[c], self.stages):
            mine.assign_from(first)

    def compile(self, *args, **kwargs):
        """Keras's compile; refuses optimizers that would step tensor-parallel shards
        unlike their whole weights (`tensor_parallel.check_optimizer`).

        Raises:
            ConfigError: per-variable `clipnorm`, or an optimizer that reads whole
                variables (LAMB, Adafactor, Muon), with tensor-parallel layers.
        """
        super().compile(*args, **kwargs)
        placed_updates.place(self.optimizer)
        from tfdist.model_parallel import tensor_parallel

        tensor_parallel.check_optimizer(self.optimizer, self.pipeline_layers)

    def stage(self, s):
        """The layers of stage `s`."""
        return self.stage_layers[s]

    def crossing(self, s):
        """Ids of the tensors stage `s` takes (the tensors crossing its first cut)."""
        return self.stages[s].inputs

    def run_stage(self, s, values, training=None, copy=0):
        """Stage `s` (of copy `copy`) forward on its device: its input tensors -> its
        output tensors.

        `values` is a list aligned with `crossing(s)`, or a single tensor
        when exactly one tensor crosses; so is the result.
        """
        single = not isinstance(values, (list, tuple))
        result = self.pipelines[copy][s].forward([values] if single else list(values),
                                                 training=training)
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
        m, p, n = self.microbatches, len(self.stage_devices), self.num_copies
        # Copy c takes rows [c*B/n, (c+1)*B/n) of the batch; each copy's rows
        # are cut into m micro-batches: n*m equal parts, in batch order.
        split = lambda t: tf.split(t, n * m) if t is not None else [None] * (n * m)  # noqa: E731
        flat = [split(t) for t in self._inputs(x)]
        xs = [[parts[j] for parts in flat] for j in range(n * m)]
        ys = [tree.map_structure(lambda t, j=j: split(t)[j], y) for j in range(n * m)]
        sws = [None] * (n * m) if sample_weight is None else [
            tree.map_structure(lambda t, j=j: split(t)[j], sample_weight)
            for j in range(n * m)]
        sums, losses, preds = [], [], []
        for c in range(n):
            parts = slice(c * m, (c + 1) * m)
            g, loss, pred, once = self._run_schedule(c, xs[parts], ys[parts], sws[parts],
                                                     n * m)
            sums.append(g)
            losses += loss
            preds += pred
        gradients, variables = [], []
        for s in range(p):
            with tf.device(self.stage_devices[s]):  # where copy 0's stage is
                for k, v in enumerate(self._stage_variables[s]):
                    total = None
                    for c in range(n):  # each copy's sum over its micro-batches, in order
                        total = _add(total, sums[c][s][k])
                    gradients.append(total)
                    variables.append(v)
        order = {id(v): k for k, v in enumerate(self.inner.trainable_variables)}
        pairs = sorted(zip(gradients, variables), key=lambda gv: order[id(gv[1])])
        graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        # With one copy, a gradient that comes straight from its stage's backward (M = 1)
        # or once a step at the stage's end (a batched Dense's, M > 1) is applied before
        # the stage makes its next one; running sums (M > 1, copies) hold a stage's
        # gradients anyway. Only then are the updates' ops recorded (placed_updates)
        # and ordered.
        chained = [(g, v) for g, v in pairs if m == 1 or id(v) in once] if n == 1 else []
        ordered = graph is not None and len(chained) > 1
        with placed_updates.recording(ordered) as update_ops:
            self.optimizer.apply([g for g, _ in pairs], [v for _, v in pairs])
            if ordered:
                update_order.updates_as_gradients_come(
                    graph, [(g, v.value) for g, v in chained], update_ops)
        for c in range(1, n):  # every copy goes on from copy 0's updated weights
            self._assign_from_first(c)
        with tf.device(self.stage_devices[-1]):
            y_pred = tree.map_structure(lambda *t: tf.concat(t, axis=0), *preds)
        self._loss_tracker.update_state(tf.add_n(losses) / (n * m),
                                        sample_weight=tf.shape(self._inputs(x)[0])[0])
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _run_schedule(self, c, xs, ys, sws, parts):
        """Copy `c`'s forwards and backwards over its micro-batches, in schedule order.

        Each micro-batch's mean loss is scaled by 1/`parts` (the batch's equal
        parts over all copies), so the summed gradients are the batch's.

        Returns:
            ([each stage's variables' gradients, summed over the micro-batches],
            the micro-batches' losses, their predictions, the ids of the variables
            whose gradients were taken once, at the step's end).
        """
        m, p = len(xs), len(self.schedule)
        split = any(a[0] == "I" for actions in self.schedule for a in actions)
        # Over several micro-batches, Dense layers' weight gradients are taken once,
        # at the step's end, over all of them; not under zero bubble (batched_weight_grads).
        batching = batched_weight_grads.in_schedule(self.schedule, m)
        steps = [stage_step.StageStep(stage, m, split, batching) for stage in self.pipelines[c]]
        losses, preds = [None] * m, [None] * m
        last = [[] for _ in range(p)]  # each device's previous action, to keep the order

        def loss(i, out):  # the last stage's: mean of equal micro-batch means, scaled
            preds[i] = self._pack(out)
            losses[i] = self._compute_loss(x=xs[i], y=ys[i], y_pred=preds[i],
                                           sample_weight=sws[i], training=True)
            return [self.optimizer.scale_loss(losses[i] / parts)]

        for action in schedules.order(self.schedule):
            stage_step.run(steps, action, xs, loss, last)
        once = set()
        for step in steps:
            once |= step.finish()
        return [step.sums for step in steps], losses, preds, once

    def save(self, filepath, *args, **kwargs):
        """Saves the plain model, unsplit and shards gathered (it loads without tfdist),
        its weights file written through a temporary file: this process holds one stage,
        not room for every stage's weights (`compat.keras_save_in_memory`)."""
        from tfdist.compat import keras_save_in_memory

        with keras_save_in_memory.on_disk():
            return surgery.gather_model(self.inner).save(filepath, *args, **kwargs)

    def unsplit(self):
        """The Keras model sharing these layers and variables (tensor-parallel
        layers stay split; `surgery.gather_model` makes it plain)."""
        return self.inner
