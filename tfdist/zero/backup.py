"""Where a sharded optimizer's state goes in a backup (pure: names and paths).

Rule: the chief's backup holds every model variable and every optimizer
variable all workers share (iterations, accumulators, the loss scale); each
worker writes the slots it owns, and only those, to a part file beside it
(BACKUP.slots-R-of-N). Slots are matched by their path (e.g.
`adam/dense_kernel_momentum`), which is the same sharded or not, so a
backup resumes on any worker count, sharded or not: each worker reads, by
name, only the slots it now holds.
"""

from __future__ import annotations

import glob

PART = "{path}.slots-{rank}-of-{n}"


def part_path(path: str, rank: int, n: int) -> str:
    """The part file of worker `rank` of `n` for the backup at `path`."""
    return PART.format(path=path, rank=rank, n=n)


def part_paths(path: str, n: int) -> list[str]:
    """Every worker's part file of the backup at `path` written by `n` workers."""
    return [part_path(path, r, n) for r in range(n)]


def existing_parts(path: str) -> list[str]:
    """The part files on disk beside the backup at `path` (to remove with it)."""
    return sorted(glob.glob(glob.escape(path) + ".slots-*-of-*"))


def shard_of(optimizer) -> tuple[int, int] | None:
    """(rank, workers) of a sharded optimizer (a LossScaleOptimizer looked through), else None."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if not getattr(inner, "_tfdist_sharded", False):
        return None
    return inner._tfdist_rank, inner._tfdist_size


def key(variable) -> str:
    """The name a slot is saved and found under."""
    return getattr(variable, "path", None) or variable.name
