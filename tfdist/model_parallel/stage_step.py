"""A stage's part of one training step: its micro-batches in flight, and each action's run.

`StageStep` is what one `Stage` holds while a step is traced: each micro-batch's
tape, inputs, outputs and (last stage) loss from its forward until its
backward, the split calls (zero bubble) until their weight gradients, the
output gradients the stage after has sent, and the running sum of its weights'
gradients, to which each backward adds as it makes them. `run` runs one action
(`schedules.Action`) of a copy's stages; `PipelineModel` walks a schedule's
`order` through it. Dropped at the step's end, so no trace's tensors outlive it.
"""

from __future__ import annotations

import tensorflow as tf
from keras import tree

from tfdist.model_parallel import batched_weight_grads
from tfdist.model_parallel import stage as stage_lib


def dense(t):
    """A tensor a control dependency can name (an IndexedSlices' values)."""
    return getattr(t, "values", t)


class StageStep:
    """One stage's state in the step being traced (see the module).

    Args:
        stage: The `Stage`.
        microbatches: M, this copy's micro-batches.
        split: Whether backwards come as I and W (zero bubble).
        batching: Whether Dense layers' weight gradients are taken once, at the
            step's end, over all micro-batches (`batched_weight_grads`).
    """

    def __init__(self, stage, microbatches: int, split: bool, batching: bool):
        self.stage = stage
        self.microbatches, self.split, self.batching = microbatches, split, batching
        self.tapes, self.inputs, self.outputs, self.targets = {}, {}, {}, {}
        self.calls = {}  # micro-batch -> its split calls (zero bubble), until W
        self.records = {}  # micro-batch -> its MicrobatchCalls, until its backward
        self.upstream = {}  # micro-batch -> the gradients of the outputs, sent back
        self.waiting = []  # backward-done DenseCalls (batched weight gradients)
        self.sums = [None] * len(stage.variables)

    def forward(self, i, h, loss):
        """Micro-batch `i`'s forward under a tape of its own; returns its outputs.

        Args:
            i: The micro-batch.
            h: Its input tensors.
            loss: outputs -> the scaled loss, for the last stage (under the tape).
        """
        stage, made, target = self.stage, None, None
        if self.batching:
            self.records[i] = batched_weight_grads.MicrobatchCalls(self.microbatches)
        with tf.GradientTape() as tape:
            if self.split:
                out, made = stage.forward_split(list(h), training=True)
                tape.watch([t for t in out if t.dtype.is_floating])
            else:
                if stage.index > 0:  # the model's inputs (maybe tokens) need no gradient
                    tape.watch([t for t in h if t.dtype.is_floating])
                out = stage.forward(list(h), training=True, batched=self.records.get(i))
            if stage.last:
                target = loss(out)
        if self.split:
            self.calls[i] = made
        if stage.last:
            self.targets[i] = target
        self.tapes[i], self.inputs[i], self.outputs[i] = tape, h, out
        return out

    def backward(self, i):
        """Micro-batch `i`'s whole backward: its weights' gradients added to the running
        sum; returns the gradients of its inputs."""
        record = self.records.pop(i, None)
        grads, into_inputs = self.stage.backward(
            self.tapes.pop(i), self.inputs.pop(i),
            self.targets.pop(i, None) or self.outputs[i], self.upstream.pop(i, None),
            batched=record)
        self.waiting += record.calls if record else []
        self._add(grads)
        return into_inputs

    def input_gradients(self, i):
        """Zero bubble's I: the gradients of micro-batch `i`'s inputs (each call's output
        gradient kept for W); returns (them, what the device's next action waits for)."""
        tape, out = self.tapes.pop(i), self.outputs[i]
        if self.stage.last:  # the loss's gradient for the outputs: its own tape
            floating = [t for t in out if t.dtype.is_floating]
            made = iter(tape.gradient(self.targets.pop(i), floating))
            given = [next(made) if t.dtype.is_floating else None for t in out]
        else:
            given = self.upstream.pop(i)
        self.inputs.pop(i)
        into_inputs, self.calls[i] = self.stage.input_gradients(self.calls.pop(i), given)
        # The next action waits for this one's gradients (the output gradients kept for
        # W where no input takes one).
        waits = [dense(t) for t in into_inputs if t is not None] or [
            dense(g) for call in self.calls[i] for _, g in call.given]
        return into_inputs, waits

    def weight_gradients(self, i):
        """Zero bubble's W: micro-batch `i`'s weights' gradients, added to the running sum
        (in micro-batch order)."""
        self._add(self.stage.weight_gradients(self.calls.pop(i)))

    def _add(self, grads):
        self.sums = [stage_lib.add_gradients(t, g) for t, g in zip(self.sums, grads)]

    def summed(self) -> list:
        """The running sum, as tensors the device's next action can wait for."""
        return [dense(t) for t in self.sums if t is not None]

    def finish(self) -> set:
        """Adds the once-a-step Dense weight gradients (over the backward-done calls)
        into the running sum, after the stage's last backward.

        Returns:
            The ids of the variables those gradients are for.
        """
        if not self.waiting:
            return set()
        grads = self.stage.batched_gradients(self.waiting)
        self._add(grads)
        return {id(v) for v, g in zip(self.stage.variables, grads) if g is not None}


def run(steps: list[StageStep], action, xs, loss, last: list) -> None:
    """Runs one action of a copy's stages, on its stage's device, after the device's
    previous action (`last[device]`, which this sets to what the next one waits for).

    Args:
        steps: The copy's `StageStep`s, by chunk.
        action: A `schedules.Action`.
        xs: Each micro-batch's model inputs.
        loss: (micro-batch, outputs) -> the last stage's scaled loss.
        last: Per device, the tensors its next action waits for.
    """
    d, kind, i, k = action
    step = steps[k]
    with tf.device(step.stage.device), tf.control_dependencies(last[d]):
        if kind == "F":
            h = xs[i] if k == 0 else steps[k - 1].outputs[i]
            last[d] = tree.flatten(step.forward(i, h, lambda out: loss(i, out)))
        elif kind == "B":
            into_inputs = step.backward(i)
            if k > 0:
                steps[k - 1].upstream[i] = into_inputs
            # Summed now, and the device's next action waits for the sum, so a stage
            # holds one micro-batch's gradients beside its running sum, never M sets.
            last[d] = step.summed()
        elif kind == "I":
            into_inputs, last[d] = step.input_gradients(i)
            if k > 0:
                steps[k - 1].upstream[i] = into_inputs
        else:  # "W"
            step.weight_gradients(i)
            last[d] = step.summed()
