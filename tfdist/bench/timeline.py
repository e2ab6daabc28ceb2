"""Per-op timelines of every task of a job (TensorFlow's profiler), and where each task idles.

A benchmark sets `TFDIST_BENCH_TRACE=STEP,MS,DIR` for `tfdist.bench.train_worker`:
after training step STEP the chief asks every task's TensorFlow server (a
pipeline's stage tasks and the chief itself, which joined the cluster) to
trace MS milliseconds into DIR (`tf.profiler.experimental.client.trace`; every
`tf.distribute.Server` answers it). The XPlane files hold every op each task
ran, on one clock across the processes of one machine.

`read` turns them into op intervals per task and the chief's step marks;
`summarize` (pure) gives, per task, the share of the traced window and of each
whole step its ops kept it busy, and the longest idle gaps with the ops either
side: whether a pipeline's stages overlap or wait for each other beyond
GPipe's bubble.
"""

from __future__ import annotations

import glob
import json
import os
import statistics
import threading

ENV = "TFDIST_BENCH_TRACE"
# The chief's event for one call of Keras's train function (one step when
# steps_per_execution is 1).
STEP_EVENT = "EagerLocalExecute: __inference_multi_step_on_iterator"


def parse_spec(text: str) -> tuple[int, int, str]:
    """Pure function: "STEP,MS,DIR" -> (step, milliseconds, directory).

    Raises:
        ValueError: for anything else, naming what was received.
    """
    parts = text.split(",", 2)
    try:
        step, ms, logdir = int(parts[0]), int(parts[1]), parts[2]
    except (IndexError, ValueError):
        step = ms = -1
        logdir = ""
    if step < 0 or ms < 1 or not logdir:
        raise ValueError(f"{ENV} takes STEP,MS,DIR (trace MS ms from after step STEP into "
                         f"DIR). Received: {text!r}.")
    return step, ms, logdir


def trace_callback(addresses: list[str], spec: str):
    """A Keras callback tracing every task at `addresses` once, as `spec` says.

    The trace runs in a thread (it blocks for its duration) while training goes on.
    """
    import keras

    step, ms, logdir = parse_spec(spec)

    class Trace(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.thread = None

        def on_train_batch_end(self, batch, logs=None):
            if self.thread is None and batch + 1 >= step:
                self.thread = threading.Thread(target=_trace, args=(addresses, ms, logdir),
                                               daemon=True)
                self.thread.start()

        def on_train_end(self, logs=None):
            if self.thread is not None:
                self.thread.join()

    return Trace()


TASKS = "tasks.json"  # the traced tasks' addresses, in task order


def _trace(addresses, ms, logdir):
    import tensorflow as tf

    tf.profiler.experimental.client.trace(
        ",".join(f"grpc://{a}" for a in addresses), logdir, ms)
    tmp = os.path.join(logdir, TASKS + ".tmp")
    with open(tmp, "w") as f:
        json.dump(addresses, f)
    os.replace(tmp, os.path.join(logdir, TASKS))


def read(logdir: str) -> tuple[dict[int, list], list]:
    """The traced ops per task and the chief's steps, in milliseconds on one clock.

    Returns:
        ({task: [(start_ms, end_ms, op name), ...] sorted}, [(start_ms, end_ms) of
        each step the chief ran]).

    Raises:
        FileNotFoundError: when no trace finished there.
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    with open(os.path.join(logdir, TASKS)) as f:
        addresses = json.load(f)
    ops, steps = {}, []
    for task, address in enumerate(addresses):
        name = address.replace(":", "_") + ".xplane.pb"
        paths = sorted(glob.glob(os.path.join(logdir, "plugins", "profile", "*", name)))
        if not paths:
            continue
        space = xplane_pb2.XSpace()
        with open(paths[-1], "rb") as f:
            space.ParseFromString(f.read())
        events = []
        for plane in space.planes:
            meta = plane.event_metadata
            for line in plane.lines:
                for e in line.events:
                    label = meta[e.metadata_id].name
                    start = line.timestamp_ns * 1e-6 + e.offset_ps * 1e-9
                    end = start + e.duration_ps * 1e-9
                    if task == 0 and label.startswith(STEP_EVENT):
                        steps.append((start, end))
                    elif ":" in label and "::" not in label and not label.startswith("Eager"):
                        events.append((start, end, label))  # "scope/op:OpType": an op
        ops[task] = sorted(events)
    return ops, sorted(steps)


def busy(intervals: list[tuple], a: float, b: float, gap_ms: float = 1.0):
    """Pure function: the time ops kept a task busy within [a, b), and its idle gaps.

    Args:
        intervals: (start, end, name) sorted by start.
        a, b: The window.
        gap_ms: Gaps shorter than this are not listed.

    Returns:
        (busy ms, [(gap start - a, gap ms, op before, op after), ...]); "start" and
        "end" name the window's edges.
    """
    total, gaps = 0.0, []
    cur_s = cur_e = None
    before = "start"
    for s, e, name in intervals:
        if s < a or s >= b:
            continue
        e = min(e, b)
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            edge = a if cur_e is None else cur_e
            if s - edge >= gap_ms:
                gaps.append((edge - a, s - edge, before, name))
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
        before = name
    if cur_e is not None:
        total += cur_e - cur_s
    edge = a if cur_e is None else cur_e
    if b - edge >= gap_ms:
        gaps.append((edge - a, b - edge, before, "end"))
    return total, gaps


def _window(ops: dict[int, list], steps: list[tuple]):
    """(first op's start, last op's end, the steps wholly inside), or None without ops."""
    every = [iv for intervals in ops.values() for iv in intervals]
    if not every:
        return None
    a, b = min(s for s, _, _ in every), max(e for _, e, _ in every)
    return a, b, [(s, e) for s, e in steps if s >= a and e <= b]


def summarize(ops: dict[int, list], steps: list[tuple], gap_ms: float = 1.0,
              top: int = 5) -> dict:
    """Pure function: per task, its busy share of the window and of each whole step.

    The window runs from the first to the last op of any task. Steps cut by the
    window's edges are left out. For the median step (by length), each task's
    `top` longest gaps.

    Returns:
        {"window_ms", "steps": [step ms], "tasks": {task: {"window_busy",
        "step_busy": [share per step], "median_step_busy" (None without a whole
        step), "median_step_gaps": [...]}}}.
    """
    window = _window(ops, steps)
    if window is None:
        return {"window_ms": 0.0, "steps": [], "tasks": {}}
    a, b, whole = window
    median = None
    if whole:
        lengths = [e - s for s, e in whole]
        median = whole[lengths.index(statistics.median_low(lengths))]
    tasks = {}
    for task, intervals in sorted(ops.items()):
        window_busy, _ = busy(intervals, a, b, gap_ms)
        shares = [busy(intervals, s, e, gap_ms)[0] / (e - s) for s, e in whole]
        gaps = busy(intervals, *median, gap_ms)[1] if median else []
        tasks[task] = {"window_busy": window_busy / (b - a), "step_busy": shares,
                       "median_step_busy": statistics.median(shares) if shares else None,
                       "median_step_gaps": sorted(gaps, key=lambda g: -g[1])[:top]}
    return {"window_ms": b - a, "steps": [e - s for s, e in whole],
            "median_step_ms": (median[1] - median[0]) if median else None, "tasks": tasks}


# Keras optimizers' default names: their update ops run under a name scope of that name.
OPTIMIZER_SCOPES = frozenset({"adam", "adamw", "sgd", "rmsprop", "adagrad", "adadelta",
                              "adamax", "nadam", "ftrl", "lion", "lamb", "adafactor", "muon",
                              "loss_scale_optimizer"})


def op_kind(name: str) -> str:
    """Pure function: the kind of a traced op, from its "scope/op:OpType" name.

    Kinds: "send/recv" (a hand-off between tasks), "batched weight grads"
    (`batched_weight_grads`' once-a-step Dense gradients), "update" (the
    optimizer's ops), "forward matmul", "backward matmul" (under a gradient
    tape), "adds" (running sums and other additions), "other".
    """
    scope, _, op_type = name.rpartition(":")
    parts = scope.lower().split("/")
    if op_type in ("_Send", "_Recv", "_HostSend", "_HostRecv"):
        return "send/recv"
    if any(p.startswith("batched_weight_grads") for p in parts):  # _1, _2: later scopes
        return "batched weight grads"
    if OPTIMIZER_SCOPES.intersection(parts) or op_type.startswith("ResourceApply"):
        return "update"
    if "MatMul" in op_type:
        return "backward matmul" if any(p.startswith("gradient_tape") for p in parts) \
            else "forward matmul"
    if op_type in ("AddV2", "AddN"):
        return "adds"
    return "other"


def by_kind(ops: dict[int, list], steps: list[tuple]) -> dict:
    """Pure function: per task, its busy share of the whole traced steps and its ops'
    milliseconds a step by `op_kind` (ops on two threads overlap: kinds can sum past
    the step).

    Returns:
        {task: {"busy": share, "ms_per_step": {kind: ms}}}; empty without a whole step.
    """
    whole = (_window(ops, steps) or (0, 0, []))[2]
    if not whole:
        return {}
    span = sum(e - s for s, e in whole)
    out = {}
    for task, intervals in sorted(ops.items()):
        kinds: dict[str, float] = {}
        for s, e, name in intervals:
            if any(x <= s < y for x, y in whole):
                kind = op_kind(name)
                kinds[kind] = kinds.get(kind, 0.0) + (e - s)
        busy_ms = sum(busy(intervals, s, e)[0] for s, e in whole)
        out[task] = {"busy": busy_ms / span,
                     "ms_per_step": {k: v / len(whole) for k, v in sorted(kinds.items())}}
    return out
