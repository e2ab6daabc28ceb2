"""Pipeline schedules as data: for each device, its forward and backward actions in order.

A schedule is a list per device (a stage task, or a logical device in one
process) of actions. An action is `(kind, i)` on a device that holds one chunk
of the model (its stage s is the device's index), or `(kind, i, k)` naming
the chunk k it runs on, when the model is cut into P·V chunks and device d
holds chunks d, d + P, ... (interleaved). Kinds:

- "F": the forward of micro-batch i through the chunk;
- "B": its whole backward (input and weight gradients);
- "I" and "W": the backward split in two (zero bubble): "I" takes the
  gradient of the chunk's inputs, what the chunk before waits for; "W" the
  gradient of its weights, which nothing waits for, so it fills the bubble.

One loop runs any of them (`tfdist.model_parallel.pipeline`), so every
schedule shares every line of code but these lists, can be printed (`draw`)
and is checked as data (`check`, `order`), the way
`torch.distributed.pipelining` keeps its schedules apart from its stages.

- GPipe: every forward, then every backward. A stage holds the activations
  of all M micro-batches at once.
- 1F1B (PipeDream-flush): stage s runs P - 1 - s forwards to fill the
  pipeline, then alternates one forward and one backward, then drains. A stage
  holds at most P micro-batches' activations, whatever M; the bubble is
  GPipe's, (P - 1) / (M + P - 1).
- Interleaved 1F1B (Megatron-LM): V chunks a device, micro-batches taken P at
  a time through each chunk in turn; bubble (P - 1) / (V·M + P - 1), a
  device's peak activations (1 + (P - 1) / (P·V)) of 1F1B's. M must be a
  multiple of P.
- ZB-H1 (Qi et al. 2024): each backward split into I and W, the W of a
  micro-batch put off while an I or a forward can run, and no stage holding
  more micro-batches (F done, W not) than 1F1B's first stage, P. With equal
  F, I and W times the paper's bubble is (P - 1) / (3M + P - 1); this one
  reaches it at P = 2 and stays within 2 time steps of it at P = 4 and 8
  (1F1B: (P - 1) / (M + P - 1)).

Each device runs a chunk's backwards (B, or W) in micro-batch order, so its
weights' gradients are summed in micro-batch order whatever the schedule.
"""

from __future__ import annotations

from typing import NamedTuple

from tfdist.errors import ConfigError

NAMES = ("gpipe", "1f1b", "interleaved", "zb")
KINDS = ("F", "B", "I", "W")
# What an action makes that another waits for: a forward its chunk's outputs; a B or an
# I the gradient of its chunk's inputs (W makes the weights' gradients: nothing waits).
OUTPUTS, INPUT_GRADIENTS = "outputs", "input gradients"
MAKES = {"F": OUTPUTS, "B": INPUT_GRADIENTS, "I": INPUT_GRADIENTS, "W": None}


class Action(NamedTuple):
    """One action, resolved: which device runs which kind (`KINDS`) on which
    micro-batch and chunk. A schedule's lists write it short, `(kind, i)` on the
    device's own chunk or `(kind, i, k)` (`of`)."""

    device: int
    kind: str
    microbatch: int
    chunk: int

    @classmethod
    def of(cls, action: tuple, device: int) -> "Action":
        """Pure function: the short `action` of `device`, resolved.

        Raises:
            ConfigError: for a kind not in `KINDS`.
        """
        if action[0] not in KINDS:
            raise ConfigError(f"Pipeline schedule: device {device} cannot run {action!r}: "
                              f"its kind is not one of {KINDS}.")
        return cls(device, action[0], action[1], action[2] if len(action) == 3 else device)

    def waits_for(self, chunks: int) -> list[tuple[str, int, int]]:
        """Pure function: what this action waits for, as (what, micro-batch, chunk):
        a forward for the chunk before's outputs; B or I for its own forward's outputs
        and the chunk after's input gradients; W for its own I."""
        i, k = self.microbatch, self.chunk
        if self.kind == "F":
            return [(OUTPUTS, i, k - 1)] if k else []
        if self.kind == "W":
            return [(INPUT_GRADIENTS, i, k)]
        return [(OUTPUTS, i, k)] + ([(INPUT_GRADIENTS, i, k + 1)] if k + 1 < chunks else [])

    def made(self) -> tuple[str, int, int] | None:
        """Pure function: (what, micro-batch, chunk) this action makes that another
        waits for (None for W)."""
        what = MAKES[self.kind]
        return None if what is None else (what, self.microbatch, self.chunk)


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


def interleaved(stages: int, microbatches: int, virtual: int) -> list[list[tuple[str, int, int]]]:
    """Pure function: Megatron-LM's interleaved 1F1B, each device holding `virtual` chunks.

    Device d runs chunks d, d + P, ..., d + (V-1)·P. Its forwards take P
    micro-batches through its first chunk, the same P through its second, and
    so on, then the next P; its backwards the same with the chunks reversed.
    It warms up with 2·(P - 1 - d) + (V - 1)·P forwards, then alternates.

    Raises:
        ConfigError: for V < 2, or M not a multiple of P.
    """
    _check(stages, microbatches)
    if virtual < 2 or microbatches % stages:
        raise ConfigError(
            f"--schedule interleaved needs --virtual-stages V >= 2 and --microbatches a "
            f"multiple of the {stages} stages (micro-batches go through each chunk {stages} at "
            f"a time). Received: --virtual-stages {virtual}, --microbatches {microbatches}. "
            f"Use --virtual-stages 2 and --microbatches {stages * max(1, -(-microbatches // stages))}.")
    p, total = stages, microbatches * virtual

    def action(kind, n, d):  # the device's n-th forward (or backward)
        group = n % (p * virtual)
        chunk = group // p if kind == "F" else virtual - 1 - group // p
        return (kind, (n // (p * virtual)) * p + n % p, chunk * p + d)

    out = []
    for d in range(p):
        warm = min(2 * (p - 1 - d) + (virtual - 1) * p, total)
        actions = [action("F", n, d) for n in range(warm)]
        forward, backward = warm, 0
        while forward < total:
            actions += [action("F", forward, d), action("B", backward, d)]
            forward, backward = forward + 1, backward + 1
        actions += [action("B", n, d) for n in range(backward, total)]
        out.append(actions)
    return out


def zero_bubble(stages: int, microbatches: int) -> list[list[tuple[str, int]]]:
    """Pure function: ZB-H1, found by running the stages in unit time steps.

    At each step a free stage runs, by priority: its next I (the stage before
    waits for it), its next forward (unless it would hold more than P
    micro-batches, 1F1B's peak: forwards done whose W is not), its oldest
    pending W (so W fills what would be idle).
    F, I and W each take one step; what they are ready for is 1F1B's rule.
    """
    _check(stages, microbatches)
    p, m = stages, microbatches
    out = [[] for _ in range(p)]
    done = {}  # (kind, i, s) -> the step it finished at
    forward, backward, weight = [0] * p, [0] * p, [0] * p
    free, t = [0] * p, 0
    while any(w < m for w in weight):
        for s in range(p):
            if free[s] > t:
                continue
            f, b = forward[s], backward[s]
            ready = lambda key: done.get(key, t + 1) <= t  # noqa: E731
            if b < f and ready(("F", b, s)) and (s == p - 1 or ready(("I", b, s + 1))):
                act = ("I", b)
                backward[s] += 1
            elif f < m and f - weight[s] < p and (s == 0 or ready(("F", f, s - 1))):
                act = ("F", f)
                forward[s] += 1
            elif weight[s] < b and ready(("I", weight[s], s)):
                act = ("W", weight[s])
                weight[s] += 1
            else:
                continue
            out[s].append(act)
            done[(*act, s)] = t + 1
            free[s] = t + 1
        t += 1
    return out


def build(name: str, stages: int, microbatches: int, virtual: int = 1) -> list[list[tuple]]:
    """The schedule called `name` (one of `NAMES`), for P stages (devices) and M micro-batches.

    Args:
        name: "gpipe", "1f1b", "interleaved" or "zb".
        stages: P, devices (stage tasks).
        microbatches: M.
        virtual: V, chunks a device holds (interleaved only; 1 otherwise).

    Raises:
        ConfigError: for an unknown name (listing the known ones), V > 1 with
            another schedule than interleaved, or what `interleaved` refuses.
    """
    if name not in NAMES:
        raise ConfigError(f"--schedule must be one of {', '.join(NAMES)}. Received: {name!r}.")
    if name == "interleaved":
        return interleaved(stages, microbatches, virtual)
    if virtual != 1:
        raise ConfigError(f"--virtual-stages {virtual} gives each stage {virtual} chunks of "
                          f"the model, which only --schedule interleaved runs. Received: "
                          f"--schedule {name}. Pass --schedule interleaved, or drop "
                          "--virtual-stages.")
    return {"gpipe": gpipe, "1f1b": one_f_one_b, "zb": zero_bubble}[name](stages, microbatches)


def chunks(name: str, stages: int, virtual: int = 1) -> int:
    """Pure function: the pieces the model is cut into for schedule `name` (P·V or P)."""
    return stages * (virtual if name == "interleaved" else 1)


def parts(action: tuple, device: int) -> tuple[str, int, int]:
    """Pure function: (kind, micro-batch, chunk) of an action of `device`."""
    return (action[0], action[1], action[2] if len(action) == 3 else device)


def chunk_count(schedule: list[list[tuple]]) -> int:
    """Pure function: the chunks a schedule runs (P when it has no action)."""
    return 1 + max((parts(a, d)[2] for d, acts in enumerate(schedule) for a in acts),
                   default=len(schedule) - 1)


def check(schedule: list[list[tuple]], microbatches: int) -> int:
    """Pure check: each chunk's actions are complete, once each, on the right device.

    Every chunk k (on device k mod P) has F(i) and either B(i) or both I(i)
    and W(i) for every micro-batch i, each once, a forward before its backward.

    Returns:
        The number of chunks.

    Raises:
        ConfigError: naming the first missing, repeated or misplaced action.
    """
    p = len(schedule)
    seen = {}
    for d, actions in enumerate(schedule):
        for position, action in enumerate(actions):
            kind, i, k = parts(action, d)
            if kind not in KINDS or not 0 <= i < microbatches or k % p != d:
                raise ConfigError(f"Pipeline schedule: device {d} cannot run {action!r} (kinds "
                                  f"{KINDS}, micro-batches 0..{microbatches - 1}, chunks "
                                  f"{d}, {d + p}, ...).")
            if (kind, i, k) in seen:
                raise ConfigError(f"Pipeline schedule: {action!r} twice on device {d}.")
            seen[(kind, i, k)] = position
    count = 1 + max(k for _, _, k in seen) if seen else p
    for k in range(count):
        for i in range(microbatches):
            back = ["B"] if ("B", i, k) in seen else ["I", "W"]
            for kind in ["F", *back]:
                if (kind, i, k) not in seen:
                    raise ConfigError(f"Pipeline schedule: chunk {k} misses {kind}{i}.")
            if ("B", i, k) in seen and ("I", i, k) in seen:
                raise ConfigError(f"Pipeline schedule: chunk {k} runs both B{i} and I{i}.")
            if any(seen[(kind, i, k)] < seen[("F", i, k)] for kind in back) or (
                    back == ["I", "W"] and seen[("W", i, k)] < seen[("I", i, k)]):
                raise ConfigError(f"Pipeline schedule: chunk {k} runs a backward of "
                                  f"micro-batch {i} before its forward (or W before I).")
    return count


def order(schedule: list[list[tuple]]) -> list[Action]:
    """Pure function: every action, resolved, in an order a run can follow.

    Each device keeps its own order; across chunks (k - 1 feeds k), an action
    runs once what it waits for (`Action.waits_for`) is made. Devices take
    turns, each running what it can, as devices working at once would.

    Raises:
        ConfigError: for a schedule that deadlocks, or an action of an unknown kind.
    """
    p, count = len(schedule), chunk_count(schedule)
    done: set = set()
    position = [0] * p
    out = []
    total = sum(len(actions) for actions in schedule)
    while len(out) < total:
        progressed = False
        for d in range(p):
            while position[d] < len(schedule[d]):
                action = Action.of(schedule[d][position[d]], d)
                if not all(w in done for w in action.waits_for(count)):
                    break
                if action.made() is not None:  # W: nothing waits for it
                    done.add(action.made())
                out.append(action)
                position[d] += 1
                progressed = True
        if not progressed:
            raise ConfigError(f"Pipeline schedule deadlocks: device positions {position} of "
                              f"{[len(a) for a in schedule]}.")
    return out


def peak_in_flight(actions: list[tuple]) -> int:
    """Pure function: the most (micro-batch, chunk) activations a device holds at once.

    A forward keeps its activations until its backward (B) or, split, its W.
    Under interleaving each is a chunk's: 1/V of a stage's.
    """
    alive, peak = 0, 0
    for action in actions:
        alive += {"F": 1, "B": -1, "W": -1}.get(action[0], 0)
        peak = max(peak, alive)
    return peak


def draw(schedule: list[list[tuple]]) -> str:
    """Pure function: one line per device, its actions in order ('F0 F1 B0 ...';
    'F0.2' is micro-batch 0 on chunk 2)."""
    return "\n".join(f"stage {s}: " + " ".join(
        f"{a[0]}{a[1]}" + (f".{a[2]}" if len(a) == 3 else "") for a in actions)
        for s, actions in enumerate(schedule))


def _check(stages: int, microbatches: int) -> None:
    if stages < 1 or microbatches < 1:
        raise ConfigError(f"A pipeline needs stages >= 1 and microbatches >= 1. Received: "
                          f"stages={stages}, microbatches={microbatches}.")
