"""Pure arithmetic of optimizer-state sharding: who owns which variable, and what is refused.

No TensorFlow: the option is checked, and the split computed, from names and
sizes alone.
"""

from __future__ import annotations

from tfdist.errors import ConfigError
# Optimizers whose update reads a whole weight: taken where owners hold whole variables
# ("optimizer", "gradients"), refused at "parameters".
from tfdist.optim import reads_whole_weights



def owners(sizes: list[int], n: int) -> list[int]:
    """The rank that owns each variable: whole variables, largest first, each to the least
    loaded rank (ties: the lower index, the lower rank), so every worker computes the same.

    Args:
        sizes: Each variable's size (bytes or elements), in the optimizer's order.
        n: Data-parallel workers.

    Returns:
        One rank in [0, n) per variable.

    Raises:
        ValueError: for n < 1 or a negative size.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1. Received: n={n!r}.")
    if any(s < 0 for s in sizes):
        raise ValueError(f"sizes must be >= 0. Received: sizes={list(sizes)!r}.")
    load = [0] * n
    out = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(n), key=lambda r: (load[r], r))
        out[i] = rank
        load[rank] += sizes[i]
    return out


def rounds(sizes: list[int], owner: list[int], n: int) -> list[list[int | None]]:
    """Gather rounds: round k holds each rank's k-th largest owned variable (None when it
    owns fewer), so the variables gathered together are of similar size (the greedy
    split hands them out largest first) and a round's padding stays small.

    Args:
        sizes: Each variable's size.
        owner: Each variable's rank (`owners(sizes, n)`).
        n: Data-parallel workers.

    Returns:
        Rounds, each a list of n variable indices or None, by rank.
    """
    mine = [sorted((i for i, o in enumerate(owner) if o == r), key=lambda i: (-sizes[i], i))
            for r in range(n)]
    depth = max((len(m) for m in mine), default=0)
    return [[m[k] if k < len(m) else None for m in mine] for k in range(depth)]


def row_chunks(shape: tuple, max_elements: int) -> list[tuple[int, int] | None]:
    """Row ranges [r0, r1) of at most `max_elements` each (at least one row) covering a
    variable of `shape`; [None] when one piece is the whole variable (or it has no rows)."""
    if len(shape) == 0 or shape[0] == 0:
        return [None]
    rows, row = shape[0], 1
    for d in shape[1:]:
        row *= d
    step = max(1, max_elements // max(row, 1))
    if step >= rows:
        return [None]
    return [(r, min(rows, r + step)) for r in range(0, rows, step)]


def column_chunks(width: int, max_elements: int) -> list[tuple[int, int]]:
    """Column ranges [a, b) of at most `max_elements` (at least one) covering `width`
    columns, in order; one range for a width of 0."""
    step = max(1, max_elements)
    return [(a, min(width, a + step)) for a in range(0, width, step)] or [(0, 0)]


def owned_bytes(sizes: list[int], n: int) -> list[int]:
    """Bytes (or elements) each rank owns under `owners(sizes, n)`."""
    load = [0] * n
    for size, rank in zip(sizes, owners(sizes, n)):
        load[rank] += size
    return load


def row_share(rows: int, n: int, rank: int) -> tuple[int, int, int]:
    """Rows [start, stop) of a variable's first axis that `rank` holds at `--shard
    parameters`, and every rank's padded share `per` (FSDP's split on dim 0): ranks hold
    ceil(rows / n) rows each, the last ones fewer (or none), padded with zero rows to
    `per` so every gather and reduce-scatter moves one size.

    Raises:
        ValueError: for n < 1, a rank outside [0, n) or negative rows.
    """
    if n < 1 or not 0 <= rank < n or rows < 0:
        raise ValueError(f"need n >= 1, 0 <= rank < n and rows >= 0. Received: rows={rows!r}, "
                         f"n={n!r}, rank={rank!r}.")
    per = max(1, -(-rows // n))
    start = min(rank * per, rows)
    return start, min(start + per, rows), per


# What `--shard` splits across the data-parallel workers, each level including the ones
# before it (docs/zero.md); "none": every worker holds everything.
LEVELS = ("none", "optimizer", "gradients", "parameters")


def level(adapter) -> str:
    """The sharding level a run asks for: `--shard`, or "optimizer" for the spelled-out
    `--shard-optimizer-state` (a higher `--shard` includes it).

    Args:
        adapter: The run's `StrategyOptions` (or anything with `shard` and
            `shard_optimizer_state`).
    """
    shard = getattr(adapter, "shard", "none") or "none"
    if shard == "none" and getattr(adapter, "shard_optimizer_state", False):
        return "optimizer"
    return shard


def holdings(sizes: list[int], n: int, rank: int, level: str, slot_bytes: int) -> str:
    """Pure function: the line a worker prints before its first step, of what it will hold.

    Args:
        sizes: Each trainable variable's bytes, in the optimizer's order.
        n: Data-parallel workers.
        rank: This worker's rank.
        level: "optimizer" or "gradients".
        slot_bytes: This worker's bytes of sharded optimizer state (counted once built).
    """
    owner = owners(sizes, n)
    mine = [s for s, o in zip(sizes, owner) if o == rank]
    grads = (f"the reduced gradients of its {len(mine)} of {len(sizes)} variables "
             f"({_bytes(sum(mine))} of {_bytes(sum(sizes))})" if level == "gradients" else
             f"every reduced gradient ({_bytes(sum(sizes))})")
    return (f"tfdist: worker {rank} of {n} (--shard {level}) holds every weight "
            f"({_bytes(sum(sizes))}, the largest {_bytes(max(sizes, default=0))}), the optimizer "
            f"state of its {len(mine)} of {len(sizes)} variables ({_bytes(slot_bytes)}), and "
            f"{grads}")


def _bytes(n: int) -> str:
    """'512 B', '3.4 KiB', '257.0 MiB', '1.2 GiB'."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


def check_config(settings) -> None:
    """Pre-TensorFlow checks of a run asking for `--shard` (pure).

    "optimizer" and "gradients" give each variable, whole, to one owner, so an
    optimizer whose update reads a whole weight (lamb, adafactor, muon) works there;
    "parameters" splits every weight, and refuses them.

    Raises:
        ConfigError: for gradient compression at `--shard gradients` or
            `parameters`, or a whole-weight optimizer at `parameters`.
    """
    adapter = settings.adapter
    shard = level(adapter)
    if shard in ("gradients", "parameters") and adapter.grad_compression != "none":
        raise ConfigError(
            f"--shard {shard} reduce-scatters the gradients, which --grad-compression does "
            f"not apply to. Received: --grad-compression {adapter.grad_compression}. Drop "
            "--grad-compression, or use --shard optimizer (its gradients are all-reduced, "
            "compressed).")
    name = settings.optimization.optimizer
    if shard == "parameters" and reads_whole_weights(name):
        raise ConfigError(
            f"--shard parameters splits every weight across the workers, and {name}'s update "
            f"reads a whole weight. Received: --optimizer {name} --shard parameters. Use "
            "--shard gradients (each worker updates whole variables), or another optimizer.")
