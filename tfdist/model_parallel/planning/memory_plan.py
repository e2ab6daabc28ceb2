"""What each process of a split model will hold in a training step, before the first step.

Per process (each stage task; in one process, each device), in bytes:

- weights: its variables;
- optimizer: its optimizer variables (Keras makes each slot beside its variable);
- gradients: its trainable variables once (M = 1, one copy: each applied as it
  comes), or twice at M > 1 or with copies (a stage's running sum beside the
  micro-batch's gradients its backward has just made); a Dense layer whose
  weight gradients are taken once a step (`batched_weight_grads`) counts its
  weights once and the step's kept rows (its inputs and pre-activation
  gradients) instead;
- activations: the layer outputs of one micro-batch through its stages (the
  tensors a tape keeps, counted at each layer's output; a layer's internals,
  attention scores say, come on top), times the most micro-batches the
  schedule keeps in flight on it (`schedules.peak_in_flight`).

Read from the built model, its compiled optimizer and its schedule; printed by
`MemoryPlan` when training begins.
"""

from __future__ import annotations

import math


def device_rows(model, microbatch_rows: int) -> list[tuple]:
    """Per process: (name, weights, optimizer, gradients, activations, in flight), bytes.

    Args:
        model: A compiled `PipelineModel` (its optimizer built).
        microbatch_rows: Examples in one micro-batch of one copy.
    """
    import numpy as np

    from tfdist import parameters
    from tfdist.model_parallel import batched_weight_grads, placement, schedules

    def process(device: str) -> str:
        name = placement.short_name(device)
        return name.split("/")[0] if name.startswith("task:") else name

    def nbytes(v) -> int:
        return parameters.count([v]) * np.dtype(v.dtype).itemsize

    rows: dict[str, list] = {}

    def add(device, column, amount):
        rows.setdefault(process(device), [0, 0, 0, 0, 0])[column] += amount

    trainable = {id(v) for v in model.trainable_variables}
    held = 1 if (model.microbatches == 1 and model.num_copies == 1) else 2
    batched = {}
    if batched_weight_grads.in_schedule(model.schedule, model.microbatches):
        for stage in model.stages:
            for weights, kept in _batched(stage, microbatch_rows * model.microbatches):
                batched.update({id(v): stage.device for v in weights})
                add(stage.device, 2, kept)
    for v in model.weights:
        add(placement.variable_device(v), 0, nbytes(v))
        if id(v) in trainable:
            add(placement.variable_device(v), 2, (1 if id(v) in batched else held) * nbytes(v))
    for v in getattr(model.optimizer, "variables", []):
        add(placement.variable_device(v), 1, nbytes(v))
    for stage, actions in zip(model.stages, model.schedule):
        per_example = sum(_example_bytes(t) for node in stage._nodes for t in node.outputs)
        add(stage.device, 3, per_example * microbatch_rows)
        entry = rows[process(stage.device)]
        entry[4] = max(entry[4], schedules.peak_in_flight(actions))
    return [(name, *values) for name, values in rows.items()]


def _batched(stage, step_rows: int) -> list[tuple]:
    """(weights, bytes kept a step) of each Dense call of `stage` whose weight gradients
    are taken once a step over `step_rows` examples (`batched_weight_grads`)."""
    import numpy as np

    from tfdist.model_parallel import batched_weight_grads as bwg

    out = []
    for node in stage._nodes:
        layer = node.operation
        if (id(layer) not in stage._batchable or not bwg.plain_dense(layer)
                or len(node.input_tensors) != 1):
            continue
        rows = bwg.call_rows((step_rows, *tuple(node.input_tensors[0].shape)[1:]))
        units_in, units_out = bwg.units(layer)
        if bwg.worth_batching(rows, units_in, units_out):
            size = np.dtype(layer.kernel.dtype).itemsize
            out.append((layer.trainable_weights, rows * (units_in + units_out) * size))
    return out


def _example_bytes(tensor) -> int:
    """Bytes of one example of a symbolic Keras tensor (its batch axis left out)."""
    import numpy as np

    shape = [d for d in tuple(tensor.shape)[1:]]
    if any(d is None for d in shape):
        return 0  # a dynamic axis: not estimated
    return math.prod(shape) * np.dtype(tensor.dtype).itemsize


def format_rows(rows: list[tuple]) -> str:
    """Pure function: the memory table, one line per process and a peak estimate."""
    head = ("process", "weights", "optimizer", "gradients", "activations/mb", "in flight",
            "step peak")
    body = []
    for name, weights, optimizer, gradients, activations, flight in rows:
        peak = weights + optimizer + gradients + activations * flight
        body.append((name, *(_mb(x) for x in (weights, optimizer, gradients, activations)),
                     str(flight), _mb(peak)))
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                              for i, (c, w) in enumerate(zip(r, widths)))
    line = fmt(head)
    return "\n".join([line, "-" * len(line), *map(fmt, body)])


def _mb(nbytes: int) -> str:
    if nbytes < 2**20:
        return f"{nbytes / 2**10:.1f} KiB"
    return f"{nbytes / 2**20:.1f} MiB"


def callback(microbatch_rows: int):
    """A Keras callback printing the table when training begins (the optimizer is built)."""
    import keras

    class MemoryPlan(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            model = self.model
            if not getattr(model, "stages", None):
                return
            if not model.optimizer.built:
                model.optimizer.build(model.trainable_variables)
            print("tfdist: memory each process holds in a step (before the first step):\n"
                  + format_rows(device_rows(model, microbatch_rows)), flush=True)

    return MemoryPlan()
