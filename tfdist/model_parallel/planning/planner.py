"""The planner: each schedule's step time, bubble and per-device peak memory, predicted.

Pure Python. From a short measured pass (`profile.layer_costs`: each layer
call's forward, input-gradient and weight-gradient time on a micro-batch, its
weights' optimizer update and the add of its gradients into a running sum,
the bytes of activations it keeps, its weights' bytes; and the fixed cost of
one action whatever its work, `profile.action_s`), the cuts each schedule
makes (P chunks, or P·V interleaved), and the time one hand-off between
devices costs, `predict` runs each schedule on paper (`simulate.run`) and
counts what each device holds at its peak: its weights with their
gradients and optimizer slots, and the activations of the micro-batches in
flight (F done, its B or W not), chunk by chunk, over a measured baseline
(what a process holds before its stage: TensorFlow itself). A Dense layer
whose weight gradient is taken once a step (`batched_weight_grads`; every
schedule but zero bubble) costs no W per micro-batch but M of them after its
device's last action. `plan` does it
for every schedule offered, `choose` picks the fastest that fits a memory
limit, and `format_predictions` and `reason` print the result beside the
placement table (`tfdist.strategies.pipeline`).
"""

from __future__ import annotations

import dataclasses

from tfdist.errors import ConfigError
from tfdist.model_parallel import batched_weight_grads, schedules
from tfdist.model_parallel.planning import simulate


@dataclasses.dataclass(frozen=True)
class LayerCost:
    """One layer call, measured on one micro-batch.

    Attributes:
        forward_s: Its forward.
        input_s: Its inputs' gradient (I).
        weight_s: Its weights' gradient (W).
        activation_bytes: What its forward keeps for the backward (its outputs).
        weight_bytes: Its weights' bytes (0 for a call of a layer already counted).
        update_s: The optimizer's update of its weights, once a step (0 for a call
            of a layer already counted).
        accumulate_s: The add of one micro-batch's gradients of its weights into the
            step's running sum, M - 1 times a step (0 for a call of a layer
            already counted).
        batched_upto: The most micro-batches a step at which its weight gradient
            is taken once, after the stage's last backward, rather than per
            micro-batch (`batched_weight_grads`; 0: never).
    """

    forward_s: float
    input_s: float
    weight_s: float
    activation_bytes: int
    weight_bytes: int
    update_s: float = 0.0
    accumulate_s: float = 0.0
    batched_upto: int = 0

    def batched(self, microbatches: int) -> bool:
        """Whether its weight gradient is taken once a step at M = `microbatches`."""
        return 1 < microbatches <= self.batched_upto


def chunk_costs(layers: list[LayerCost], bounds: list[int], microbatches: int = 1) -> list[dict]:
    """Pure function: the layers' costs summed over each chunk [bounds[k], bounds[k+1]).

    A layer whose weight gradient is taken once a step at M = `microbatches`
    puts no W or running-sum add in a micro-batch's actions; "WB" is its
    weight gradients' time over the whole step (M micro-batches' rows), run
    after the chunk's last backward.
    """
    out = []
    for a, b in zip(bounds, bounds[1:]):
        part = layers[a:b]
        every = [x for x in part if not x.batched(microbatches)]
        once = [x for x in part if x.batched(microbatches)]
        out.append({"F": sum(x.forward_s for x in part), "I": sum(x.input_s for x in part),
                    "W": sum(x.weight_s for x in every),
                    "WB": microbatches * sum(x.weight_s for x in once),
                    "activation_bytes": sum(x.activation_bytes for x in part),
                    "U": sum(x.update_s for x in part),
                    "A": sum(x.accumulate_s for x in every),
                    "weight_bytes": sum(x.weight_bytes for x in part)})
    return out


def peak_bytes(actions: list[tuple], device: int, chunks: list[dict]) -> int:
    """Pure function: the most activation bytes `device` holds at once under its actions."""
    alive = peak = 0
    for action in actions:
        kind, _, k = schedules.parts(action, device)
        alive += {"F": 1, "B": -1, "W": -1}.get(kind, 0) * chunks[k]["activation_bytes"]
        peak = max(peak, alive)
    return peak


def predict(name: str, layers: list[LayerCost], bounds: list[int], stages: int,
            microbatches: int, virtual: int = 1, hop_s: float = 0.0,
            state_factor: float = 4.0, baseline_bytes: int = 0, action_s: float = 0.0) -> dict:
    """Pure function: one schedule's predicted step, bubble and each device's peak bytes.

    Args:
        name: The schedule (`schedules.NAMES`).
        layers: Each layer call's measured cost, in the model's call order.
        bounds: The cuts for this schedule: [0, ..., len(layers)], P·V + 1 of them.
        stages: P, devices.
        microbatches: M.
        virtual: V (interleaved).
        hop_s: What one tensor hand-off between devices adds.
        state_factor: Bytes held a weight byte: the weight, its gradient sum and
            the optimizer's slots (4 for Adam: 2 slots; `state_factor`).
        baseline_bytes: What each process holds before its stage (TensorFlow's
            own memory), added to each device's peak.
        action_s: The fixed cost of one action (`profile.action_s`), added to each
            (`simulate.run`'s `action`).

    Returns:
        {"step_s", "bubble", "busy_s": [per device], "peak_bytes": [per device],
        "activation_bytes": [per device]}.
    """
    schedule = schedules.build(name, stages, microbatches, virtual)
    chunks = chunk_costs(layers, bounds, microbatches if batched_weight_grads.in_schedule(
        schedule, microbatches) else 1)
    if len(chunks) != schedules.chunks(name, stages, virtual):
        raise ConfigError(f"The planner got {len(chunks)} chunk(s) for --schedule {name} on "
                          f"{stages} stages (V={virtual}); it cuts "
                          f"{schedules.chunks(name, stages, virtual)}.")

    def cost(kind, k):
        c = chunks[k]
        return c["I"] + c["W"] if kind == "B" else c[kind]

    run = simulate.run(schedule, cost, hop=hop_s, action=action_s,
                       accumulate=lambda k: chunks[k]["A"])
    # Each device takes its once-a-step weight gradients and updates its own weights
    # once its last action is done.
    updates = [sum(c["U"] + c["WB"] for k, c in enumerate(chunks) if k % stages == d)
               for d in range(stages)]
    step = max(last + u for last, u in zip(run["last"], updates))
    held = [sum(c["weight_bytes"] for k, c in enumerate(chunks) if k % stages == d)
            for d in range(stages)]
    activations = [peak_bytes(actions, d, chunks) for d, actions in enumerate(schedule)]
    return {"step_s": step, "bubble": run["bubble"], "busy_s": run["busy"],
            "activation_bytes": activations,
            "weight_bytes": held,
            "peak_bytes": [baseline_bytes + int(state_factor * w) + a
                           for w, a in zip(held, activations)]}


def state_factor(slots: int = 2, microbatches: int = 1, copies: int = 1) -> int:
    """Pure function: bytes a process holds per weight byte: the weight, the optimizer's
    `slots` (Adam 2, SGD with momentum 1), and its gradients once (M = 1, one copy)
    or twice (a running sum beside a micro-batch's own), as `memory_plan` counts them."""
    return 1 + slots + (1 if microbatches == 1 and copies == 1 else 2)


def offered(stages: int, microbatches: int, virtual: int = 1) -> dict[str, int]:
    """Pure function: the schedules `--schedule auto` weighs, each with its V.

    gpipe, 1f1b and zb always; interleaved (with `virtual`, 2 when 1) where M
    is a multiple of P and there are at least two stages.
    """
    out = {"gpipe": 1, "1f1b": 1, "zb": 1}
    if stages > 1 and microbatches % stages == 0:
        out["interleaved"] = max(virtual, 2)
    return out


def plan(layers: list[LayerCost], cut, stages: int, microbatches: int,
         schedules_v: dict[str, int], hop_s: float = 0.0, state: float = 4.0,
         baseline_bytes: int = 0, action_s: float = 0.0) -> dict[str, dict]:
    """Pure function: `predict` for each schedule of `schedules_v` (name -> V).

    Args:
        layers: Each layer call's measured cost.
        cut: chunks -> the bounds [0, ..., len(layers)] of that many chunks, or
            None where the model cannot be cut that many ways (the schedule
            is then left out).
        stages, microbatches, hop_s, baseline_bytes, action_s: as `predict`.
        schedules_v: The schedules offered (`offered`).
        state: `predict`'s `state_factor`.

    Returns:
        name -> `predict`'s result with "bounds" and "virtual" added.
    """
    out = {}
    for name, v in schedules_v.items():
        bounds = cut(schedules.chunks(name, stages, v))
        if bounds is None:
            continue
        out[name] = {"bounds": list(bounds), "virtual": v, **predict(
            name, layers, list(bounds), stages, microbatches, v, hop_s, state, baseline_bytes,
            action_s)}
    return out


def choose(predictions: dict[str, dict], memory_limit_bytes: int | None = None) -> str:
    """Pure function: the fastest schedule whose every device fits `memory_limit_bytes`.

    Raises:
        ConfigError: when none fits, naming each schedule's largest device.
    """
    fits = {n: p for n, p in predictions.items()
            if memory_limit_bytes is None or max(p["peak_bytes"]) <= memory_limit_bytes}
    if not fits:
        peaks = ", ".join(f"{n} {max(p['peak_bytes']) / 2**20:.0f} MiB"
                          for n, p in predictions.items())
        raise ConfigError(f"No pipeline schedule fits {memory_limit_bytes / 2**20:.0f} MiB a "
                          f"process (predicted peaks: {peaks}). Use more stages (each holds "
                          "less of the model), a smaller --global-batch-size (fewer "
                          "activation bytes in flight), or free memory.")
    return min(fits, key=lambda n: (fits[n]["step_s"], n))


def reason(predictions: dict[str, dict], chosen: str,
           memory_limit_bytes: int | None = None) -> str:
    """Pure function: one line saying which schedule `--schedule auto` picked and why."""
    best = predictions[chosen]
    rest = sorted((p["step_s"], n) for n, p in predictions.items() if n != chosen)
    faster = [n for s, n in rest if s < best["step_s"]]
    limit = ("" if memory_limit_bytes is None
             else f" {memory_limit_bytes / 2**20:.0f} MiB a process")
    why = (f"the fastest that fits{limit} (faster: {', '.join(faster)}, too large)" if faster
           else f"the fastest predicted{', and it fits' + limit if limit else ''}")
    runner = (f"; next {rest[0][1]} {rest[0][0] * 1e3:.1f} ms" if rest else "")
    v = f" v={best['virtual']}" if best.get("virtual", 1) > 1 else ""
    return (f"tfdist: --schedule auto picked {chosen}{v}: {why}: predicted "
            f"{best['step_s'] * 1e3:.1f} ms a step, bubble {best['bubble']:.2f}, peak "
            f"{max(best['peak_bytes']) / 2**20:.0f} MiB a process{runner}")


def format_predictions(predictions: dict[str, dict],
                       memory_limit_bytes: int | None = None) -> str:
    """Pure function: the planner's table, one row a schedule: its predicted step,
    bubble, each process's peak and whether it fits `memory_limit_bytes`."""
    head = ("schedule", "step ms", "bubble", "peak MiB per process", "fits")
    body = []
    for name, p in sorted(predictions.items(), key=lambda kv: (kv[1]["step_s"], kv[0])):
        v = p.get("virtual", 1)
        fits = (memory_limit_bytes is None or max(p["peak_bytes"]) <= memory_limit_bytes)
        body.append((name + (f" v={v}" if v > 1 else ""), f"{p['step_s'] * 1e3:.1f}",
                     f"{p['bubble']:.3f}", " / ".join(f"{b / 2**20:.0f}" for b in p["peak_bytes"]),
                     "yes" if fits else "no"))
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                              for i, (c, w) in enumerate(zip(r, widths)))
    line = fmt(head)
    return "\n".join([line, "-" * len(line), *map(fmt, body)])
