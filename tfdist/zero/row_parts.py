"""Backups at `--shard parameters`: each worker writes its own rows (#51).

Rule: a split variable (weights, and the optimizer slots of their rows) is
never gathered for a backup. Worker R of N writes the rows it holds, without
their padding, to a part file beside the chief's backup
(BACKUP.rows-R-of-N, `zero.backup`), keyed like the backup's own entries (`model_3`,
`opt_7`) and recording each entry's row range and a SHA-256 of the part. The
chief's file holds the whole variables and the record, whose signatures give
the whole shapes, so the backup reads as one replica's: `RowArrays` returns
a whole entry joined from the parts (one process, another `--shard` level,
`tfdist.export`) or only rows [start, stop) of it, read from the parts that
hold them (a worker at `--shard parameters` on any worker count), so no
process of the resumed run holds more than its rows either.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping

import numpy as np

from tfdist.errors import CheckpointError
from tfdist.npz_stream import hash_array, write_file
from tfdist.zero.backup import ROWS, part_path, part_paths

_META = "meta"


def save(path: str, rank: int, n: int, entries: dict) -> str:
    """Writes worker `rank`'s rows beside the backup at `path`, atomically.

    Args:
        entries: key -> (start, stop, value): the rows [start, stop) of the whole
            entry `key` this worker holds, `value` holding at least stop - start
            rows (a padded share; the padding is not written), read one at a time.

    Returns:
        The part's path.
    """
    target = part_path(path, rank, n, ROWS)

    def items():  # hashed as written; the record, which holds the digest, last
        h, ranges = hashlib.sha256(), {}
        for key in sorted(entries):
            start, stop, value = entries[key]
            array = np.asarray(value() if callable(value) else value)[:stop - start]
            hash_array(h, key, array)
            ranges[key] = [int(start), int(stop)]
            yield key, array
        record = {"rank": rank, "workers": n, "rows": ranges, "sha256": h.hexdigest()}
        yield _META, np.frombuffer(json.dumps(record).encode(), dtype=np.uint8)

    write_file(target, items())
    return target


def _read_record(part: str) -> dict:
    with np.load(part, allow_pickle=False) as npz:
        return json.loads(npz[_META].tobytes().decode())


def check(path: str, n: int, keys) -> list[dict]:
    """Every part of the backup at `path` (`n` workers) exists, reads, matches its
    digest, and together they cover each key's rows once; their records, by rank.

    Raises:
        CheckpointError: naming the first missing or damaged part.
    """
    hint = "Delete it to resume from an older backup, or pass --no-resume to start fresh."
    records = []
    for part in part_paths(path, n, ROWS):
        if not os.path.exists(part):
            raise CheckpointError(f"Backup {path} is incomplete: the rows of a worker are "
                                  f"missing ({part}). {hint}")
        try:
            record = _read_record(part)
            h = hashlib.sha256()
            with np.load(part, allow_pickle=False) as npz:
                for key in sorted(record["rows"]):
                    hash_array(h, key, npz[key])
        except Exception as e:  # zipfile.BadZipFile, EOFError, KeyError, ValueError, ...
            raise CheckpointError(f"Backup {path}'s part {part} is corrupt or truncated "
                                  f"({type(e).__name__}: {e}). {hint}") from None
        if h.hexdigest() != record.get("sha256"):
            raise CheckpointError(f"Backup {path}'s part {part} is corrupt: its arrays do not "
                                  f"match the SHA-256 recorded when it was written. {hint}")
        records.append(record)
    for key in keys:
        spans = sorted(tuple(r["rows"][key]) for r in records if key in r["rows"])
        covered = 0
        for start, stop in spans:
            if start != covered and start < stop:
                raise CheckpointError(f"Backup {path}'s parts do not hold every row of "
                                      f"{key!r} once ({spans}). {hint}")
            covered = max(covered, stop)
    return records


class RowArrays(Mapping):
    """A backup's arrays (`base`) with the entries its workers wrote as row parts joined.

    `arrays[key]` is the whole entry; `rows(key, start, stop)` reads only the parts
    holding rows [start, stop) of it.
    """

    def __init__(self, base: Mapping, path: str, records: list[dict]):
        self.base, self.path, self.records = base, path, records
        self.row_keys = sorted({k for r in records for k in r["rows"]})

    def rows(self, key: str, start: int, stop: int):
        """Rows [start, stop) of entry `key`."""
        pieces = []
        for record in self.records:
            a, b = record["rows"].get(key, (0, 0))
            lo, hi = max(a, start), min(b, stop)
            if lo < hi:
                part = part_path(self.path, record["rank"], record["workers"], ROWS)
                with np.load(part, allow_pickle=False) as npz:
                    pieces.append((lo, npz[key][lo - a:hi - a]))
        if not pieces:
            raise KeyError(key)
        return np.concatenate([p for _, p in sorted(pieces, key=lambda x: x[0])], axis=0)

    def total_rows(self, key: str) -> int:
        return max(r["rows"][key][1] for r in self.records if key in r["rows"])

    def __getitem__(self, key):
        if key in self.row_keys:
            return self.rows(key, 0, self.total_rows(key))
        return self.base[key]

    def __iter__(self):
        return iter(sorted(set(self.base) | set(self.row_keys)))

    def __len__(self):
        return len(set(self.base) | set(self.row_keys))
