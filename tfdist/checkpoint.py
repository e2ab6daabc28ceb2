"""Backups: the training state a rerun resumes from, written through the run's writer.

`BackupStore` keeps the newest backups of a run in MODEL_DIR/backup (written
by the chief only, atomically, through `tfdist.writer.ChiefWriter`), checks
a backup against the run before restoring it, and moves a corrupt one aside.
`rebatch` and `check_layout` are the pure arithmetic of a backup's data
position.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import zipfile
from collections.abc import Mapping

import numpy as np

from tfdist import backup_layouts, backup_parts, reshard
from tfdist.errors import CheckpointError
from tfdist.model_dir import BACKUP_DIR
from tfdist.npz_stream import hash_array, write_npy
from tfdist.writer import ChiefWriter
from tfdist.zero import backup as zero_backup
from tfdist.zero.optimizer import is_shard_slot

# A backup is one .npz file, written by the chief only, atomically, holding
# every model variable (weights, non-trainable state, RNG seed-generator
# state), every optimizer variable, and a JSON record of where training was
# (epoch, step in epoch, global step), what wrote it (recipe, variable
# signature, global batch, and, for the record only, the strategy and replica
# count) and a SHA-256 of the arrays. Values are read from mirrored variables
# locally, which needs no collective, so other workers never write anything,
# not even to a temporary place; except where a layout puts parts beside it
# (`tfdist.backup_layouts`: each sharded worker's slots or rows, each stage
# process's variables), each written by the process that holds them.

BACKUP_FORMAT = 1
_PREFIX, _SUFFIX = "ckpt-", ".npz"
CORRUPT_SUFFIX = ".corrupt"  # a backup that failed to load, moved aside by the chief


@dataclasses.dataclass
class TrainState:
    """Where training is; saved in every backup.

    Attributes:
        epoch: Epochs completed.
        step_in_epoch: Steps completed in the current epoch.
        global_step: Optimizer steps completed in all.
        history: Per-epoch metrics of the completed epochs.
        data_offset: Added to `global_step` to give the data position in
            global batches of this run's size: 0 unless the run was resumed
            at another global batch (see `rebatch`).
    """

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    history: dict = dataclasses.field(default_factory=dict)
    data_offset: int = 0

    @property
    def data_position(self) -> int:
        """Global batches of the repeated training data consumed so far."""
        return self.global_step + self.data_offset


def signature(variables) -> list[list]:
    """[path, shape, dtype] of each variable: what a backup must match; a tensor-parallel
    shard adds the plain weight it is a slice of ([plain path, axis, start, stop, plain
    shape], `tfdist.reshard`)."""
    out = []
    for v in variables:
        entry = [getattr(v, "path", None) or v.name, list(v.shape),
                 str(getattr(v.dtype, "name", v.dtype))]
        plain = getattr(v, "_tfdist_plain", None)
        out.append(entry + [list(plain)] if plain else entry)
    return out


def match_by_path(got: list, want: list) -> list[int] | None:
    """Pure function: for each variable of signature `want`, the index of the backup
    variable (signature `got`) with the same path; None when paths cannot decide
    (a path missing, repeated, or not in both), and positions are used.

    A model split into stages lists its variables in its stages' order, which is
    not the unsplit model's; their paths (`layer/variable`, and the optimizer's
    slots named after them) are the same in every layout. Optimizer paths are
    also tried without their first part, the optimizer's name.
    """
    def keyed(signature, drop):  # drop: without the first part (an optimizer's own name)
        return [p.split("/", 1)[-1] if drop and p else p for p, *_ in signature]

    for drop in (False, True):  # "adam/x_momentum" is "adam_1/x_momentum" in a second Adam
        got_paths, want_paths = keyed(got, drop), keyed(want, drop)
        if (None in got_paths or len(set(got_paths)) != len(got_paths)
                or len(set(want_paths)) != len(want_paths)
                or set(got_paths) != set(want_paths)):
            continue
        index = {path: i for i, path in enumerate(got_paths)}
        return [index[path] for path in want_paths]
    return None


def _digest(arrays: dict) -> str:
    h = hashlib.sha256()
    for key in sorted(arrays):
        hash_array(h, key, arrays[key])
    return h.hexdigest()


class BackupStore:
    """The backups of one model dir: save, list, load, validate.

    Every worker reads; every write (save, prune, move aside, clear) goes
    through the run's `ChiefWriter`, so only the chief writes.

    Args:
        writer: The run's ChiefWriter; backups go to MODEL_DIR/backup.
        keep: How many of the newest backups to keep (older ones are removed).
        shard: (rank, workers) of a sharded optimizer (`tfdist.zero.backup`).
        placed: Each task writes its own variables (`tfdist.backup_parts`), for
            variables that live in other processes than the chief.
    """

    def __init__(self, writer: ChiefWriter, keep: int = 3, shard: tuple[int, int] | None = None,
                 placed: bool = False):
        self.writer = writer
        self.placed = placed
        self.shard = shard  # (rank, workers) of a sharded optimizer: see tfdist.zero.backup
        self.directory = writer.path(BACKUP_DIR)
        self.keep = max(1, keep)
        self.skipped: list[tuple[str, str]] = []  # (path, why) passed over by `resume`
        self.record: dict | None = None  # the meta record `resume` restored from
        self.layout = None  # how this run's backups are stored (`tfdist.backup_layouts`)

    def paths(self) -> list[str]:
        """Backup files, oldest first."""
        return backup_paths(self.directory)

    def path_for(self, global_step: int) -> str:
        """The file the backup of `global_step` is (or will be) written to."""
        return os.path.join(self.directory, f"{_PREFIX}{global_step:010d}{_SUFFIX}")

    def latest(self) -> str | None:
        """The newest backup, or None."""
        paths = self.paths()
        return paths[-1] if paths else None

    def save(self, state: TrainState, model_vars, optimizer_vars, meta: dict) -> str | None:
        """Writes a backup of `state` (chief only); returns its path or None.

        Args:
            state: Training position to record.
            model_vars: Model variables (`model.variables`).
            optimizer_vars: Optimizer variables (`optimizer.variables`).
            meta: What identifies the run (recipe, global_batch_size, ...) and
                what ran it (strategy, num_replicas), recorded as given.
        """
        model_vars, optimizer_vars, split = _whole(model_vars, optimizer_vars)
        if self.layout is None:  # chosen once, from the store's options and the variables
            self.layout = backup_layouts.for_run(self.writer.is_chief, self.shard,
                                                 self.placed, split)
        target = self.path_for(state.global_step)
        chief = self.layout.write(target, model_vars, optimizer_vars, meta)  # every worker
        if not self.writer.is_chief:
            return None  # not even the arrays are read: nothing to write them to
        # One array at a time: read, hash, write, drop, so the chief never holds a copy
        # of every pipeline stage's weights and slots at once (#29). The entries go in
        # the digest's (sorted) order so each variable is read once; the loader reads
        # entries by name, and the meta record, which holds the digest, comes last.
        variables, optimizer_vars = chief.entries, chief.optimizer_vars

        def write(tmp):
            h = hashlib.sha256()
            with zipfile.ZipFile(tmp, mode="w", compression=zipfile.ZIP_STORED,
                                 allowZip64=True) as npz:
                for key in sorted(variables):
                    array = np.asarray(variables[key].numpy())
                    hash_array(h, key, array)
                    write_npy(npz, key, array)
                    del array
                record = {**chief.meta, "format": BACKUP_FORMAT,
                          "state": dataclasses.asdict(state),
                          "model_signature": signature(model_vars),
                          "optimizer_signature": signature(optimizer_vars),
                          "sha256": h.hexdigest()}
                write_npy(npz, "meta",
                           np.frombuffer(json.dumps(record).encode(), dtype=np.uint8))

        path = self.writer.write_file(target, write, suffix=_SUFFIX)
        for old in self.paths()[:-self.keep]:
            self.writer.remove(old)
            for part in backup_layouts.part_files(old):
                self.writer.remove(part)
        self._remove_orphan_parts()
        return path

    def _remove_orphan_parts(self) -> None:
        """Removes part directories no kept backup names: a pruned or replaced backup's,
        or those of a save killed before its index was written."""
        kept = set()
        for path in self.paths():
            with contextlib.suppress(CheckpointError):
                kept.add(self.read_record(path).get("parts_dir"))
        for name in os.listdir(self.directory):
            if backup_parts.PARTS in name and name not in kept:
                self.writer.remove(os.path.join(self.directory, name))
        # Row parts of a save that never got its record (a worker killed before it).
        have = {os.path.basename(p) for p in self.paths()}
        for name in os.listdir(self.directory):
            base = zero_backup.backup_of(name, zero_backup.ROWS)
            if base is not None and base not in have:
                self.writer.remove(os.path.join(self.directory, name))

    @staticmethod
    def read_record(path: str) -> dict:
        """A backup's meta record alone: no array is read (an .npz is read entry by
        entry), so every process can look at a backup larger than itself.

        Raises:
            CheckpointError: when the file or its record cannot be read.
        """
        try:
            with np.load(path, allow_pickle=False) as npz:
                return json.loads(npz["meta"].tobytes().decode())
        except Exception as e:  # zipfile.BadZipFile, KeyError, ValueError, ...
            raise CheckpointError(f"Backup {path} is corrupt or truncated "
                                  f"({type(e).__name__}: {e}).") from None

    @staticmethod
    def load(path: str) -> tuple[dict, dict]:
        """Reads a backup: (meta record, arrays by key, each read from the file when
        asked for: the digest is checked first, one array at a time).

        Raises:
            CheckpointError: when the file is truncated, corrupt or not a backup.
        """
        hint = ("Delete it to resume from an older backup, or pass --no-resume to start "
                "fresh.")
        # The digest is checked one array at a time (read, hash, drop), and the arrays
        # returned are read again when assigned: a backup larger than the chief resumes.
        try:
            with np.load(path, allow_pickle=False) as npz:
                keys = [k for k in npz.files if k != "meta"]
                record = json.loads(npz["meta"].tobytes().decode())
                h = hashlib.sha256()
                for key in sorted(keys):
                    hash_array(h, key, npz[key])
        except Exception as e:  # zipfile.BadZipFile, EOFError, ValueError, KeyError, ...
            raise CheckpointError(f"Backup {path} is corrupt or truncated "
                                  f"({type(e).__name__}: {e}). {hint}") from None
        if record.get("format") != BACKUP_FORMAT:
            raise CheckpointError(f"Backup {path} has format {record.get('format')!r}; this "
                                  f"tfdist reads format {BACKUP_FORMAT}. {hint}")
        if h.hexdigest() != record.get("sha256"):
            raise CheckpointError(f"Backup {path} is corrupt: its arrays do not match the "
                                  f"SHA-256 recorded when it was written. {hint}")
        # The parts beside it (workers' slots or rows, tasks' variables): there, whole,
        # and read as one replica's arrays.
        layout = backup_layouts.of_record(record)
        layout.check(path, record)
        return record, layout.arrays(path, record, _Arrays(path, keys))

    @staticmethod
    def check_compatible(path: str, record: dict, expected: dict,
                         batch_change_ok: bool = False) -> dict:
        """Refuses a backup written by a different run; where each variable is in it.

        The strategy and replica count are not compared: every global batch
        holds the same examples whatever the number of replicas, and every
        replica holds the same weights, so a data-parallel backup resumes on
        any number of replicas at the same global batch with the same math.

        Args:
            path: The backup's file (named in the error).
            record: Its meta record.
            expected: This run's values for the same keys (recipe,
                global_batch_size, accumulate, model_signature,
                optimizer_signature).
            batch_change_ok: --rescale-lr-on-batch-change: another global
                batch is accepted (the caller rescales and re-positions).

        Returns:
            {"model": indices, "optimizer": indices}: for each variable of this run,
            the backup's index of the same variable (`match_by_path`, else its position).

        Raises:
            CheckpointError: naming the first mismatch and both values.
        """
        hint = ("Use another --model-dir, or pass --no-resume to start fresh there (which "
                "deletes these backups).")
        keys = ("recipe", "accumulate") if batch_change_ok else (
            "recipe", "global_batch_size", "accumulate")
        for key in keys:
            if key not in record and key == "accumulate":
                continue  # an older tfdist did not record it
            if key in expected and record.get(key) != expected[key]:
                raise CheckpointError(
                    f"Backup {path} cannot be resumed: it was written with {key}="
                    f"{record.get(key)!r} but this run has {key}={expected[key]!r}. {hint}")
        order = {}
        signatures = {"model": (record.get("model_signature", []), expected["model_signature"])}
        if "optimizer_signature" in expected:  # else matched by name (a sharded optimizer's)
            signatures["optimizer"] = (record.get("optimizer_signature", []),
                                       expected["optimizer_signature"])
        sharded = any(len(e) > 3 for got, want in signatures.values() for e in got + want)
        for what, (got, want) in signatures.items():
            by_path = match_by_path(got, want)
            if by_path is None and sharded:  # tensor parallel on either side: by plain weight
                model_got, model_want = signatures["model"]
                pieces = (reshard.model_pieces, reshard.model_pieces) if what == "model" else (
                    lambda sig: reshard.optimizer_pieces(sig, model_got),
                    lambda sig: reshard.optimizer_pieces(sig, model_want))
                order[what] = reshard.plan(pieces[0](got), pieces[1](want), what, path)
                continue
            if len(got) != len(want):
                raise CheckpointError(
                    f"Backup {path} cannot be resumed: it holds {len(got)} {what} variables "
                    f"but this {what} has {len(want)}. {hint}")
            order[what] = by_path or list(range(len(want)))
            for i, (wp, ws, wd, *_) in zip(order[what], want):
                gp, gs, gd, *_ = got[i]
                if gs != ws or gd != wd:
                    raise CheckpointError(
                        f"Backup {path} cannot be resumed: {what} variable {wp!r} has shape "
                        f"{ws} ({wd}) here but {gs} ({gd}) in the backup ({gp!r}). {hint}")
        return order

    def resume(self, enabled: bool, meta: dict, model_vars, optimizer_vars,
               scope=contextlib.nullcontext, batch_change_ok: bool = False,
               ) -> tuple[TrainState | None, str | None]:
        """Restores the newest good backup into the variables, or clears old backups.

        A corrupt or truncated newest backup is skipped for the newest good
        one; the chief moves the bad file aside (to NAME.corrupt, never
        deleted) and `skipped` lists what was passed over and why.

        Args:
            enabled: False for --no-resume: the chief deletes old backups, which
                would otherwise shadow the new run's.
            meta: This run's identity (recipe, global_batch_size, accumulate)
                and, when known, its data layout (steps_per_epoch).
            model_vars: Model variables to fill.
            optimizer_vars: Optimizer variables to fill (built already).
            scope: Context manager for the assignments (the strategy's scope).
            batch_change_ok: Accept a backup written at another global batch
                (its position is then the caller's to map, see `rebatch`).

        Returns:
            (state, path) of the backup resumed from; (None, path of the newest
            deleted backup) after --no-resume; (None, None) when there was none.

        Raises:
            CheckpointError: when every backup is corrupt (naming the newest), or
                the newest good one is from another run or another data layout.
        """
        paths = self.paths()
        if paths and not enabled:
            self.writer.remove(self.directory)
            return None, paths[-1]
        # --shard parameters: a split variable matches and reads a whole one, keeping its rows.
        model_vars, optimizer_vars, _ = _whole(model_vars, optimizer_vars)
        self.skipped = []
        for path in reversed(paths):
            try:
                record, arrays = self.load(path)
                break
            except CheckpointError as e:
                self.skipped.append((path, str(e)))
        else:
            if self.skipped:
                raise CheckpointError(self.skipped[0][1])  # nothing good to fall back to
            return None, None
        for bad, _ in self.skipped:
            self.writer.move_aside(bad, CORRUPT_SUFFIX)
        by_name = bool(record.get("slot_parts")) or any(is_shard_slot(v) for v in optimizer_vars)
        expected = {**meta, "model_signature": signature(model_vars)}
        if not by_name:  # else each optimizer variable is found by name in `restore_by_name`
            expected["optimizer_signature"] = signature(optimizer_vars)
        order = self.check_compatible(path, record, expected, batch_change_ok)
        state = TrainState(**record["state"])
        self.record = record
        same_batch = record.get("global_batch_size") == meta.get("global_batch_size")
        if "steps_per_epoch" in meta and same_batch:
            check_layout(path, record, state, meta["steps_per_epoch"])
        with scope():
            backup_layouts.of_record(record).restore(path, record, arrays, model_vars,
                                                     optimizer_vars, order, by_name)
        return state, path

    @staticmethod
    def restore(arrays: dict, model_vars, optimizer_vars, order: dict | None = None) -> None:
        """Assigns a backup's arrays to the variables (call in the strategy scope).

        Args:
            order: As `check_compatible` returns (None: by position).
        """
        backup_layouts.restore_positions(arrays, model_vars, optimizer_vars, order)


def backup_paths(directory: str) -> list[str]:
    """The backup files in `directory` (a run's backup dir), oldest first."""
    if not os.path.isdir(directory):
        return []
    names = sorted(f for f in os.listdir(directory)
                   if f.startswith(_PREFIX) and f.endswith(_SUFFIX))
    return [os.path.join(directory, f) for f in names]


class _Arrays(Mapping):
    """A backup file's arrays by key, each read from the file when asked for."""

    def __init__(self, path: str, keys: list[str]):
        self.path, self.keys_ = path, keys

    def __getitem__(self, key):
        if key not in self.keys_:
            raise KeyError(key)
        with np.load(self.path, allow_pickle=False) as npz:
            return npz[key]

    def __iter__(self):
        return iter(self.keys_)

    def __len__(self):
        return len(self.keys_)


def _whole(model_vars, optimizer_vars):
    """(model_vars, optimizer_vars) with each split variable seen whole
    (`zero.parameters.whole_view`), and the model's `Split` or None."""
    from tfdist.zero import parameters

    model_vars, optimizer_vars = list(model_vars), list(optimizer_vars)
    every, split, _ = parameters.whole_view(model_vars + optimizer_vars)
    return every[:len(model_vars)], every[len(model_vars):], split


def check_layout(path: str, record: dict, state: TrainState, steps_per_epoch: int) -> None:
    """Refuses a backup whose position cannot be mapped onto this run's epochs.

    At an epoch end the position maps exactly whatever the epoch length: the
    data position is the global step and the next epoch starts there. A
    backup taken mid-epoch under another `--steps-per-epoch` has no such
    mapping (the epoch it was in would end at a different step).

    Raises:
        CheckpointError: naming both epoch lengths.
    """
    written = record.get("steps_per_epoch")  # None: an older tfdist did not record it
    if state.step_in_epoch == 0 or (written in (None, steps_per_epoch)
                                    and state.step_in_epoch < steps_per_epoch):
        return
    raise CheckpointError(
        f"Backup {path} cannot be resumed: it was taken at step {state.step_in_epoch} of an "
        f"epoch of {written if written else 'unrecorded length'} steps (steps_per_epoch="
        f"{written!r}), but this run has steps_per_epoch={steps_per_epoch}; a mid-epoch "
        "position cannot be mapped onto epochs of another length. Rerun with the backup's "
        "--steps-per-epoch to finish that epoch, or pass --no-resume to start fresh.")


def rebatch(state: TrainState, old_batch: int, new_batch: int, old_batches_per_pass: int,
            new_batches_per_pass: int) -> tuple[TrainState, int]:
    """Pure function: a backup's position taken at `old_batch`, at `new_batch`.

    The data position is kept in examples, not steps: the training data is
    read in passes, each batched on its own (its last partial batch
    dropped), so a position is (passes done, examples done in this pass).
    Those examples of the pass are a multiple of `old_batch` and need not be
    of `new_batch`: the run then goes on at the first new-size batch holding
    no example it has already trained on in this pass (the next multiple of
    `new_batch`), skipping fewer than `new_batch` examples of this pass, like
    the partial batch every pass drops; rounding down instead would train
    some examples twice in one epoch. A position past the pass's last full
    new-size batch goes on at the next pass (and epoch).

    The global step keeps counting optimizer steps (backup names, schedules);
    `data_offset` carries the difference to the data position.

    Args:
        state: The backup's position.
        old_batch: The global batch the backup was written at.
        new_batch: This run's global batch.
        old_batches_per_pass: Full batches in one pass of the data at `old_batch`.
        new_batches_per_pass: The same at `new_batch`.

    Returns:
        (the position at `new_batch`, examples of the current pass skipped).
    """
    passes, in_pass = divmod(state.data_position, old_batches_per_pass)
    seen = in_pass * old_batch
    steps = -(-seen // new_batch)  # ceil: no example of this pass twice
    skipped = steps * new_batch - seen
    epoch, step_in_epoch = state.epoch, state.step_in_epoch and steps
    if steps >= new_batches_per_pass:  # what is left of this pass fills no new batch
        skipped = max(0, new_batches_per_pass * new_batch - seen)
        passes, steps = passes + 1, 0
        if state.step_in_epoch:
            epoch, step_in_epoch = epoch + 1, 0
    position = passes * new_batches_per_pass + steps
    return dataclasses.replace(state, epoch=epoch, step_in_epoch=step_in_epoch,
                               data_offset=position - state.global_step,
                               history={k: list(v) for k, v in state.history.items()}), skipped
