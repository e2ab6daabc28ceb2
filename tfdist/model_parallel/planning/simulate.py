"""A schedule run on paper: each action's start and end from its duration. Pure Python.

Each device runs its actions in the schedule's order, each as soon as its
device is free and what it waits for (`schedules.order`'s rule) has ended,
plus `hop` for a tensor that crosses from another device. With unit times this
gives each schedule's bubble from its formula (tests/model_parallel/
test_schedules.py); with measured times (`planner`) a step's prediction.
"""

from __future__ import annotations

from tfdist.model_parallel import schedules

UNIT = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}


def unit_cost(virtual: int = 1):
    """(kind, chunk) -> time: a forward 1, its input and weight gradients 1 each,
    divided over V chunks a stage."""
    return lambda kind, chunk: UNIT[kind] / virtual


def run(schedule: list[list[tuple]], cost, hop: float = 0.0, action: float = 0.0,
        accumulate=None) -> dict:
    """Pure function: when each device is busy, running `schedule` with durations `cost`.

    Args:
        schedule: Actions per device (`schedules`).
        cost: (kind, chunk) -> seconds (or units).
        hop: Added where a forward or input gradient crosses to another device.
        action: Added to every action's duration: what running one action costs
            whatever its work (`profile.action_s`), so a schedule of more,
            smaller actions (ZB's B split into I and W) pays for each.
        accumulate: chunk -> seconds added to each action that makes the chunk's
            weight gradients (B, or W where B is split) after its first one: the
            add into the step's running sum (the first gradients start it).

    Returns:
        {"step": the last end, "busy": [per device, the sum of its actions],
        "bubble": 1 - mean(busy) / step, "ends": {(what, i, chunk): end}, what
        being `schedules.OUTPUTS`, `schedules.INPUT_GRADIENTS` or "W" (the weights'
        gradients made or, after an I, on their way),
        "last": [per device, its last action's end]}.
    """
    p = len(schedule)
    free = [0.0] * p
    busy = [0.0] * p
    end: dict = {}
    summed: set = set()  # the chunks whose running sum has been started
    count = schedules.chunk_count(schedule)

    def after(key, device):  # plus a hop for what another device made
        t = end.get(key, 0.0)
        return t + (hop if key in end and key[2] % p != device else 0.0)

    for act in schedules.order(schedule):
        d, kind, k = act.device, act.kind, act.chunk
        ready = max((after(w, d) for w in act.waits_for(count)), default=0.0)
        start = max(free[d], ready)
        took = cost(kind, k) + action  # the device is busy for both
        if accumulate is not None and kind in ("B", "W"):
            if k in summed:
                took += accumulate(k)
            summed.add(k)
        free[d] = start + took
        busy[d] += took
        made = act.made()
        if made is not None:
            end[made] = free[d]
        if kind != "F":  # the weights' gradient is made (B, W) or on its way (I)
            end[("W", act.microbatch, k)] = free[d]
    step = max(free) if free else 0.0
    return {"step": step, "busy": busy, "ends": end, "last": list(free),
            "bubble": 1.0 - (sum(busy) / p) / step if step else 0.0}


def formula(name: str, stages: int, microbatches: int, virtual: int = 1) -> float:
    """Pure function: the bubble each schedule's paper gives, for balanced stages and
    equal forward, input-gradient and weight-gradient times.

    gpipe and 1f1b (P-1)/(M+P-1); interleaved (P-1)/(V·M+P-1); zb (ZB-H1)
    (P-1)/(3M+P-1).
    """
    p, m = stages, microbatches
    scale = {"interleaved": virtual, "zb": 3}.get(name, 1)
    return (p - 1) / (scale * m + p - 1)
