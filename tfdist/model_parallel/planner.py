"""The planner: each schedule's step time, bubble and per-device peak memory, predicted.

Pure Python. From a short measured pass (`profile.layer_costs`: each layer
call's forward, input-gradient and weight-gradient time on a micro-batch, the
bytes of activations it keeps, its weights' bytes), the cuts each schedule
makes (P chunks, or P·V interleaved), and the time one hand-off between
devices costs, `predict` runs each schedule on paper (`simulate.run`) and
counts what each device holds at its peak: its weights with their
gradients and optimizer slots, and the activations of the micro-batches in
flight (F done, its B or W not), chunk by chunk. `choose` picks the fastest
schedule that fits a memory limit.
"""

from __future__ import annotations

import dataclasses

from tfdist.errors import ConfigError
from tfdist.model_parallel import schedules, simulate


@dataclasses.dataclass(frozen=True)
class LayerCost:
    """One layer call, measured on one micro-batch.

    Attributes:
        forward_s: Its forward.
        input_s: Its inputs' gradient (I).
        weight_s: Its weights' gradient (W).
        activation_bytes: What its forward keeps for the backward (its outputs).
        weight_bytes: Its weights' bytes (0 for a call of a layer already counted).
    """

    forward_s: float
    input_s: float
    weight_s: float
    activation_bytes: int
    weight_bytes: int


def chunk_costs(layers: list[LayerCost], bounds: list[int]) -> list[dict]:
    """Pure function: the layers' costs summed over each chunk [bounds[k], bounds[k+1])."""
    out = []
    for a, b in zip(bounds, bounds[1:]):
        part = layers[a:b]
        out.append({"F": sum(x.forward_s for x in part), "I": sum(x.input_s for x in part),
                    "W": sum(x.weight_s for x in part),
                    "activation_bytes": sum(x.activation_bytes for x in part),
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
            state_factor: float = 4.0) -> dict:
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
            the optimizer's slots (4 for Adam: 2 slots).

    Returns:
        {"step_s", "bubble", "busy_s": [per device], "peak_bytes": [per device],
        "activation_bytes": [per device]}.
    """
    schedule = schedules.build(name, stages, microbatches, virtual)
    chunks = chunk_costs(layers, bounds)
    if len(chunks) != schedules.chunks(name, stages, virtual):
        raise ConfigError(f"The planner got {len(chunks)} chunk(s) for --schedule {name} on "
                          f"{stages} stages (V={virtual}); it cuts "
                          f"{schedules.chunks(name, stages, virtual)}.")

    def cost(kind, k):
        c = chunks[k]
        return c["I"] + c["W"] if kind == "B" else c[kind]

    run = simulate.run(schedule, cost, hop=hop_s)
    held = [sum(c["weight_bytes"] for k, c in enumerate(chunks) if k % stages == d)
            for d in range(stages)]
    activations = [peak_bytes(actions, d, chunks) for d, actions in enumerate(schedule)]
    return {"step_s": run["step"], "bubble": run["bubble"], "busy_s": run["busy"],
            "activation_bytes": activations,
            "peak_bytes": [int(state_factor * w) + a for w, a in zip(held, activations)]}


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
                          f"device (predicted peaks: {peaks}). Use more stages or fewer "
                          "micro-batches in flight (--schedule 1f1b).")
    return min(fits, key=lambda n: (fits[n]["step_s"], n))
