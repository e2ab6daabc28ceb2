"""`--schedule auto` and `--balance time`: the planner run on the model before it is cut.

A short measured pass (`profile.layer_costs`, each layer call timed on one
micro-batch of the run's size, and `profile.action_s`, the fixed cost of one
action), the cuts each schedule would make (by parameters, or by that
measured time under `--balance time`), each schedule's prediction
(`planner.plan`) printed as a table beside the placement table, and under
`--schedule auto` the fastest predicted schedule whose every process fits
its memory (`planner.choose`): a memory cgroup's limit where one is set,
else what the machine has available, read by
`tfdist.memory_limit.headroom_bytes` plus what this process already holds.
The predictions count what this process holds now as each process's
baseline (TensorFlow's own memory, about 690 MB on CPU).
"""

from __future__ import annotations

import dataclasses

from tfdist.errors import ConfigError
from tfdist.model_parallel.planning import planner

HOP_S = 1e-3  # a hand-off between stage processes (docs/model_parallel.md: about 1 ms)
SLOTS = 2  # optimizer slots counted a weight: Adam's (the optimizer is made after the cut)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the planner decided before the cut.

    Attributes:
        schedule: The schedule to run (the one asked for, or auto's pick).
        virtual: Its V.
        node_costs: Each layer call's weight for the cuts (ns) under
            `--balance time`; None: parameters.
        predictions: `planner.plan`'s, per schedule offered.
        lines: What to print: the table, and auto's one-line reason.
    """

    schedule: str
    virtual: int
    node_costs: list[int] | None
    predictions: dict
    lines: list[str]


def needed(options) -> bool:
    """Whether the run asks for the planner (`--schedule auto` or `--balance time`)."""
    return options.schedule == "auto" or options.balance == "time"


def node_costs(layers: list[planner.LayerCost]) -> list[int]:
    """Pure function: each layer call's forward and backward time in ns (`--balance time`)."""
    return [max(1, round(1e9 * (c.forward_s + c.input_s + c.weight_s))) for c in layers]


def process_peaks(predictions: dict, stages_per_process: int, baseline: int) -> dict:
    """Pure function: `predictions` with each process's peak: one process holding all
    `stages_per_process` stages (P > 1, in one process) holds one baseline and every
    stage's state and activations; one stage a process (1) is each stage's own peak."""
    if stages_per_process == 1:
        return predictions
    return {n: {**p, "peak_bytes": [sum(p["peak_bytes"]) - (len(p["peak_bytes"]) - 1) * baseline]}
            for n, p in predictions.items()}


def memory_limit() -> tuple[int | None, int]:
    """(bytes a process may hold: its cgroup limit or available memory plus its own
    RSS, None when unknown; this process's RSS now, the baseline)."""
    from tfdist import memory_limit as memory

    rss = memory.rss_bytes() or 0
    headroom = memory.headroom_bytes()
    return (None if headroom is None else headroom + rss), rss


def plan(model, options, stages: int, rows: int, copies: int = 1,
         across_processes: bool = False, repeats: int = 5) -> Plan:
    """Measures `model`'s layers and plans its pipeline.

    Args:
        model: The recipe's built model (maybe without values).
        options: StrategyOptions (schedule, virtual_stages, balance, microbatches).
        stages: P.
        rows: Rows of one micro-batch.
        copies: Data-parallel copies of the pipeline.
        across_processes: One stage a process (else all in this one).
        repeats: Timings of each layer part.

    Raises:
        ConfigError: when no schedule fits memory under `--schedule auto`.
    """
    from tfdist.model_parallel import graph as graph_lib
    from tfdist.model_parallel.planning import profile

    m = options.microbatches
    layers = profile.layer_costs(model, profile.sample_inputs(model, rows), repeats)
    action = profile.action_s(repeats)
    costs = node_costs(layers) if options.balance == "time" else None
    graph = graph_lib.from_keras(model)
    weighed = graph.weighed(costs) if costs else graph

    def cut(chunks):
        try:
            return [0, *graph_lib.balanced_cuts(weighed, chunks), len(graph.nodes)]
        except ConfigError:  # too few places to cut: this schedule is not offered
            return None

    if options.schedule == "auto":
        offered = planner.offered(stages, m, options.virtual_stages)
    else:
        offered = {options.schedule: options.virtual_stages}
    limit, baseline = memory_limit()
    predictions = planner.plan(layers, cut, stages, m, offered,
                               HOP_S if across_processes else 0.0,
                               planner.state_factor(SLOTS, m, copies), baseline, action)
    per_process = process_peaks(predictions, 1 if across_processes else stages, baseline)
    where = "each stage process" if across_processes else f"this process ({stages} stages)"
    lines = [f"tfdist: the planner's predictions ({m} micro-batches of {rows} rows, layers "
             f"timed once here; peak = {baseline / 2**20:.0f} MiB baseline + weights, "
             f"gradients, Adam's slots, activations in flight; {where}; cuts by "
             f"{options.balance})\n" + planner.format_predictions(per_process, limit)]
    name, virtual = options.schedule, options.virtual_stages
    if name == "auto":
        name = planner.choose(per_process, limit)
        virtual = predictions[name]["virtual"]
        lines.append(planner.reason(per_process, name, limit))
    return Plan(name, virtual if name == "interleaved" else 1, costs, predictions, lines)
