"""Pipeline schedules as data: for each stage, its forward and backward actions in order.

A schedule is a list per stage of `("F", i)` (forward of micro-batch i) and
`("B", i)` (its backward). One stage loop runs any of them
(`tfdist.model_parallel.pipeline`), so GPipe and 1F1B share every line of
code but these lists, can be printed (`draw`) and are tested as data, the way
`torch.distributed.pipelining` keeps its schedules apart from its stages.

- GPipe: every forward, then every backward. A stage holds the activations
  of all M micro-batches at once.
- 1F1B (PipeDream-flush): stage s runs P - 1 - s forwards to fill the
  pipeline, then alternates one forward and one backward, then drains. A stage
  holds at most P micro-batches' activations, whatever M; the bubble is
  GPipe's, (P - 1) / (M + P - 1).
"""

from __future__ import annotations

from tfdist.errors import ConfigError

NAMES = ("gpipe", "1f1b")


def gpipe(stages: int, microbatches: int) -> list[list[tuple[str, int]]]:
    """Pure function: GPipe's actions per stage: all forwards, then all backwards."""
    _check(stages, microbatches)
    return [[("F", i) for i in range(microbatches)] + [("B", i) for i in range(microbatches)]
            for _ in range(stages)]


def one_f_one_b(stages: int, microbatches: int) -> list[list[tuple[str, int]]]:
    """Pure function: 1F1B's actions per stage (warm-up forwards, one-forward-one-backward, drain)."""
    _check(stages, microbatches)
    out = []
    for s in range(stages):
        warm = min(stages - 1 - s, microbatches)
        actions = [("F", i) for i in range(warm)]
        forward, backward = warm, 0
        while forward < microbatches:
            actions += [("F", forward), ("B", backward)]
            forward, backward = forward + 1, backward + 1
        actions += [("B", i) for i in range(backward, microbatches)]
        out.append(actions)
    return out


def build(name: str, stages: int, microbatches: int) -> list[list[tuple[str, int]]]:
    """The schedule called `name` ("gpipe" or "1f1b").

    Raises:
        ConfigError: for an unknown name, listing the known ones.
    """
    if name not in NAMES:
        raise ConfigError(f"--schedule must be one of {', '.join(NAMES)}. Received: {name!r}.")
    return (gpipe if name == "gpipe" else one_f_one_b)(stages, microbatches)


def order(schedule: list[list[tuple[str, int]]]) -> list[tuple[int, str, int]]:
    """Pure function: every (stage, kind, micro-batch) in an order that a run can follow.

    Each stage keeps its own order; F(i) on stage s waits for F(i) on s - 1,
    B(i) on s for B(i) on s + 1 and F(i) on s. Stages take turns, each running
    what it can, as devices working at once would.

    Raises:
        ConfigError: for a schedule that deadlocks or misses an action.
    """
    stages = len(schedule)
    done: set[tuple[int, str, int]] = set()
    position = [0] * stages
    out = []
    total = sum(len(actions) for actions in schedule)
    while len(out) < total:
        progressed = False
        for s in range(stages):
            while position[s] < len(schedule[s]):
                kind, i = schedule[s][position[s]]
                ready = ((s == 0 or (s - 1, "F", i) in done) if kind == "F" else
                         (s, "F", i) in done and (s == stages - 1 or (s + 1, "B", i) in done))
                if not ready:
                    break
                done.add((s, kind, i))
                out.append((s, kind, i))
                position[s] += 1
                progressed = True
        if not progressed:
            raise ConfigError(f"Pipeline schedule deadlocks: stage positions {position} of "
                              f"{[len(a) for a in schedule]}.")
    return out


def peak_in_flight(actions: list[tuple[str, int]]) -> int:
    """Pure function: the most micro-batches whose activations a stage holds at once."""
    alive, peak = 0, 0
    for kind, _ in actions:
        alive += 1 if kind == "F" else -1
        peak = max(peak, alive)
    return peak


def draw(schedule: list[list[tuple[str, int]]]) -> str:
    """Pure function: one line per stage, its actions in order ('F0 F1 B0 ...')."""
    return "\n".join(f"stage {s}: " + " ".join(f"{k}{i}" for k, i in actions)
                     for s, actions in enumerate(schedule))


def _check(stages: int, microbatches: int) -> None:
    if stages < 1 or microbatches < 1:
        raise ConfigError(f"A pipeline needs stages >= 1 and microbatches >= 1. Received: "
                          f"stages={stages}, microbatches={microbatches}.")
