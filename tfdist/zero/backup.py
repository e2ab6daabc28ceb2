"""Where a sharded optimizer's state goes in a backup (pure: names and paths).

Rule: the chief's backup holds every model variable and every optimizer
variable all workers share (iterations, accumulators, the loss scale); each
worker writes the slots it owns, and only those, to a part file beside it
(BACKUP.slots-R-of-N). Slots are matched by their path (e.g.
`adam/dense_kernel_momentum`), which is the same sharded or not, so a
backup resumes on any worker count, sharded or not: each worker reads, by
name, only the slots it now holds. At `--shard parameters` each worker's
rows go to a part of the other kind, BACKUP.rows-R-of-N (`row_parts`).
"""

from __future__ import annotations

import glob

SLOTS, ROWS = "slots", "rows"  # the kinds of part file
PART = "{path}.{kind}-{rank}-of-{n}"


def part_path(path: str, rank: int, n: int, kind: str = SLOTS) -> str:
    """The part file of worker `rank` of `n` for the backup at `path`."""
    return PART.format(path=path, kind=kind, rank=rank, n=n)


def part_paths(path: str, n: int, kind: str = SLOTS) -> list[str]:
    """Every worker's part file of the backup at `path` written by `n` workers."""
    return [part_path(path, r, n, kind) for r in range(n)]


def existing_parts(path: str, kind: str = SLOTS) -> list[str]:
    """The part files on disk beside the backup at `path` (to remove with it)."""
    return sorted(glob.glob(glob.escape(path) + f".{kind}-*-of-*"))


def backup_of(name: str, kind: str) -> str | None:
    """The backup file name a part file's `name` belongs to, or None for another file (a
    temporary one included)."""
    base, sep, rest = name.partition(f".{kind}-")
    rank, of, n = rest.partition("-of-")
    return base if sep and of and rank.isdigit() and n.isdigit() else None


def shard_of(optimizer) -> tuple[int, int] | None:
    """(rank, workers) of a sharded optimizer (a LossScaleOptimizer looked through), else None."""
    from tfdist import gradient_path
    from tfdist.zero.optimizer import OwnedOnly

    owned = gradient_path.steps_of(getattr(optimizer, "inner_optimizer", optimizer), OwnedOnly)
    return (owned[0].rank, owned[0].size) if owned else None


def key(variable) -> str:
    """The name a slot is saved and found under."""
    return getattr(variable, "path", None) or variable.name
