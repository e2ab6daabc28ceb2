"""How a backup's arrays are stored: one class per storage form.

`tfdist.checkpoint.BackupStore` keeps the protocol (names, the chief's atomic
write of its file, keep N, moving a corrupt backup aside, matching a backup
to the run) and leaves the storage to a layout:

- `Whole`: the chief's file holds every array (one replica, the data-parallel
  strategies).
- `SlotParts` (`--shard optimizer|gradients`): each worker writes the slots it
  owns beside the chief's file (`tfdist.zero.backup`); they are read back by
  name, so the backup resumes on any worker count, sharded or not.
- `TaskParts` (stage processes): each task writes its own variables
  (`tfdist.backup_parts`); the chief's file is the index.
- `RowParts` (`--shard parameters`): each worker writes its rows of the split
  variables (`tfdist.zero.row_parts`); they read as one replica's arrays.

The writing layout is chosen once per store, from its options and the
variables (`for_run`); a backup's own layout is read from its record
(`of_record`). Each has `write` (on every worker: its own parts, and what the
chief's file then holds), `check` and `arrays` (reading a backup), and
`restore`.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from tfdist import backup_parts, reshard
from tfdist.errors import CheckpointError
from tfdist.npz_stream import write_file
from tfdist.zero import backup as zero_backup
from tfdist.zero import row_parts
from tfdist.zero.optimizer import is_shard_slot


@dataclasses.dataclass
class ChiefFile:
    """What the chief's file of a backup holds: `entries` (key -> variable, read one at a
    time), the record's extra `meta`, and the optimizer variables its signature lists."""

    entries: dict
    meta: dict
    optimizer_vars: list


def keyed(model_vars, optimizer_vars) -> dict:
    """The entries of a backup by key: `model_I` and `opt_I`, by position."""
    out = {f"model_{i}": v for i, v in enumerate(model_vars)}
    out.update({f"opt_{i}": v for i, v in enumerate(optimizer_vars)})
    return out


def size(variable) -> int:
    return int(np.prod(variable.shape, dtype=np.int64))


def value_of(step, arrays, prefix: str):
    """A variable's value from a backup's `arrays`: the entry `step` (`check_compatible`'s
    order) or, from another tensor-parallel layout, the entries a `reshard.Assemble` joins.

    Args:
        prefix: "model" or "opt" (the entries' key prefix).
    """
    if isinstance(step, reshard.Assemble):
        return reshard.assemble(step, lambda i: arrays[f"{prefix}_{i}"])
    return arrays[f"{prefix}_{step}"]


def restore_positions(arrays, model_vars, optimizer_vars, order: dict | None = None) -> None:
    """Assigns a backup's arrays to the variables by `order` (`check_compatible`'s; None:
    by position). A split variable (`zero.parameters.Whole`) reads only its rows where
    the backup holds them as row parts."""
    order = order or {}
    row_keys = set(getattr(arrays, "row_keys", ()))
    for what, prefix, variables in (("model", "model", model_vars),
                                    ("optimizer", "opt", optimizer_vars)):
        for step, v in zip(order.get(what, range(len(variables))), variables):
            key = f"{prefix}_{step}"
            if key in row_keys and hasattr(v, "assign_rows"):  # only the rows held here
                v.assign_rows(lambda start, stop, key=key: arrays.rows(key, start, stop))
            else:
                v.assign(value_of(step, arrays, prefix))


def restore_by_name(path: str, record: dict, arrays, optimizer_vars) -> None:
    """Assigns a backup's arrays to the optimizer variables, each found by path: the
    backup's own, then its workers' slot parts, reading only what is held here (a
    zero-size slot, another worker's, reads nothing).

    Raises:
        CheckpointError: naming an optimizer variable the backup lacks or holds in
            another shape.
    """
    own = {sig[0]: f"opt_{i}" for i, sig in enumerate(record["optimizer_signature"])}
    parts = [np.load(p, allow_pickle=False)
             for p in zero_backup.part_paths(path, record.get("slot_parts") or 0)]
    try:
        where = {k: part for part in parts for k in part.files}
        for v in optimizer_vars:
            if not size(v):
                continue
            name = zero_backup.key(v)
            value = (arrays[own[name]] if name in own else where[name][name] if name in where
                     else None)
            if value is None or tuple(value.shape) != tuple(v.shape):
                found = "absent" if value is None else f"of shape {list(value.shape)}"
                raise CheckpointError(
                    f"Backup {path} cannot be resumed: optimizer variable {name!r} "
                    f"({list(v.shape)}) is {found} in it. Use another --model-dir, or pass "
                    "--no-resume to start fresh there.")
            v.assign(value)
    finally:
        for part in parts:
            part.close()


class Whole:
    """The chief's file holds every array."""

    def write(self, path: str, model_vars, optimizer_vars, meta: dict) -> ChiefFile:
        return ChiefFile(keyed(model_vars, optimizer_vars), meta, list(optimizer_vars))

    def check(self, path: str, record: dict) -> None:
        """Raises CheckpointError when a part the record names is missing or damaged."""

    def arrays(self, path: str, record: dict, arrays):
        """The backup's arrays as one replica's (`arrays`: the chief's file's)."""
        return arrays

    def restore(self, path: str, record: dict, arrays, model_vars, optimizer_vars,
                order: dict, by_name: bool) -> None:
        """Fills the variables (`by_name`: the optimizer's found by path, as a sharded
        optimizer's slots are)."""
        restore_positions(arrays, model_vars, [] if by_name else optimizer_vars, order)
        if by_name:
            restore_by_name(path, record, arrays, optimizer_vars)


class SlotParts(Whole):
    """Each worker writes the slots it owns (`tfdist.zero.backup`), the chief the rest."""

    def __init__(self, rank: int, n: int):
        self.rank, self.n = rank, n

    def write(self, path, model_vars, optimizer_vars, meta) -> ChiefFile:
        self._save_part(path, [v for v in optimizer_vars if is_shard_slot(v) and size(v)])
        shared = [v for v in optimizer_vars if not is_shard_slot(v)]
        return ChiefFile(keyed(model_vars, shared), {**meta, "slot_parts": self.n}, shared)

    def _save_part(self, path: str, slots) -> None:
        """This worker's slots beside the backup at `path`, atomically, one at a time."""
        write_file(zero_backup.part_path(path, self.rank, self.n),
                   ((zero_backup.key(v), np.asarray(v.numpy())) for v in slots))

    def check(self, path, record) -> None:
        n = record.get("slot_parts")
        missing = [p for p in zero_backup.part_paths(path, n) if not os.path.exists(p)]
        if missing:
            raise CheckpointError(f"Backup {path} is incomplete: the optimizer state of "
                                  f"{len(missing)} of its {n} workers is missing "
                                  f"({missing[0]}).")

    def restore(self, path, record, arrays, model_vars, optimizer_vars, order, by_name):
        super().restore(path, record, arrays, model_vars, optimizer_vars, order, True)


class TaskParts(Whole):
    """Each task writes its own variables (`tfdist.backup_parts`); the chief's file is the
    index, written after every part."""

    def __init__(self, is_chief: bool = True):
        self.is_chief = is_chief

    def write(self, path, model_vars, optimizer_vars, meta) -> ChiefFile:
        if not self.is_chief:  # the chief drives every task's write
            return ChiefFile({}, meta, list(optimizer_vars))
        # A new name each time: a second save of the same step never touches the
        # parts of the backup it replaces until its own index is in place.
        parts_dir = (f"{os.path.basename(path)}{backup_parts.PARTS}"
                     f"{os.getpid()}-{os.urandom(4).hex()}")
        parts = backup_parts.save(os.path.join(os.path.dirname(path), parts_dir),
                                  keyed(model_vars, optimizer_vars))
        return ChiefFile({}, {**meta, "parts_dir": parts_dir, "parts": parts},
                         list(optimizer_vars))

    def check(self, path, record) -> None:
        backup_parts.check_files(os.path.dirname(path), record)

    def arrays(self, path, record, arrays):
        return backup_parts.Arrays(os.path.dirname(path), record)

    def restore(self, path, record, arrays, model_vars, optimizer_vars, order, by_name):
        # Each variable read on its own device, only its slice.
        if "optimizer" not in order:
            raise CheckpointError(
                f"Backup {path} was written by stage processes and cannot be resumed with "
                "--shard-optimizer-state. Resume it without that option, or pass "
                "--no-resume to start fresh.")
        directory = os.path.dirname(path)
        for what, prefix, variables in (("model", "model", model_vars),
                                        ("optimizer", "opt", optimizer_vars)):
            backup_parts.restore(directory, record, variables, order[what], prefix)


class RowParts(Whole):
    """Each worker writes its rows of the split variables (`tfdist.zero.row_parts`); the
    chief's file holds the whole variables and the record, written after every part."""

    def __init__(self, split=None):
        self.split = split  # this worker's `zero.parameters.Split` (writing only)

    def write(self, path, model_vars, optimizer_vars, meta) -> ChiefFile:
        from tfdist.zero import parameters

        every = keyed(model_vars, optimizer_vars)
        rows = {}
        for key, v in every.items():
            if isinstance(v, parameters.Whole):
                start, stop, _, _ = parameters.rows_of(v.variable)
                rows[key] = (start, stop, v.variable.numpy)
        row_parts.save(path, self.split.rank, self.split.n, rows)
        # The chief's record, which names the parts, comes after every part.
        self.split.collectives.barrier()
        entries = {k: v for k, v in every.items() if k not in rows}
        return ChiefFile(entries, {**meta, "row_parts": self.split.n,
                                   "row_keys": sorted(rows)}, list(optimizer_vars))

    def arrays(self, path, record, arrays):
        return row_parts.RowArrays(arrays, path, row_parts.check(
            path, record["row_parts"], record.get("row_keys", [])))


def for_run(is_chief: bool, shard, placed: bool, split) -> Whole:
    """The layout a run writes its backups in.

    Args:
        is_chief: Whether this process writes the chief's file.
        shard: (rank, workers) of a sharded optimizer, or None.
        placed: Variables live in several processes (stage processes).
        split: The model's `zero.parameters.Split` at `--shard parameters`, or None.
    """
    if split is not None:
        return RowParts(split)
    if shard is not None:
        return SlotParts(*shard)
    if placed:
        return TaskParts(is_chief)
    return Whole()


def of_record(record: dict) -> Whole:
    """The layout a backup was written in, from its record."""
    if record.get("parts"):
        return TaskParts()
    if record.get("slot_parts"):
        return SlotParts(None, record["slot_parts"])
    if record.get("row_parts"):
        return RowParts()
    return Whole()


def part_files(path: str) -> list[str]:
    """The per-worker part files beside the backup at `path` (removed with it)."""
    return (zero_backup.existing_parts(path)
            + zero_backup.existing_parts(path, zero_backup.ROWS))
