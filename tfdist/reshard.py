"""Where each variable of a backup goes in a run split another way: pure arithmetic.

A tensor-parallel layer holds each weight of its plain layer as shards, one
variable per device (`ffn_in/kernel_0`, `ffn_in/kernel_1` for `ffn_in/kernel`),
and its optimizer slots likewise. A backup records, beside each shard's path,
the plain weight it is a slice of (`checkpoint.signature`: [plain path, axis,
start, stop, plain shape]). `plan` maps every variable of this run to the
backup's pieces of the same plain weight, so a backup written with tensor
parallel T resumes with T' or unsplit (and an unsplit one with T), each
variable assembled from the pieces it overlaps, one plain weight at a time.
Nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses

from tfdist.errors import CheckpointError


@dataclasses.dataclass(frozen=True)
class Piece:
    """Where a variable sits in its plain weight.

    Attributes:
        name: The plain weight's key (a model variable's path; an optimizer
            variable's path without the optimizer's own name).
        axis: The axis it is sliced on (None: the whole weight).
        start, stop: Its slice on `axis`.
        shape: The plain weight's shape.
    """

    name: str
    axis: int | None
    start: int
    stop: int
    shape: tuple


@dataclasses.dataclass(frozen=True)
class Assemble:
    """A variable made from backup entries: `sources` (indices, in order) joined on
    `join_axis` (None: one whole entry) make the plain weight, of which it takes
    [start, stop) on `take_axis` (None: all of it)."""

    sources: tuple
    join_axis: int | None
    take_axis: int | None
    start: int = 0
    stop: int = 0


def model_pieces(signature: list) -> list[Piece]:
    """Pure function: each model variable's `Piece` (its own path when not a shard)."""
    out = []
    for path, shape, _, *plain in signature:
        if plain and plain[0]:
            name, axis, start, stop, full = plain[0]
            out.append(Piece(name, axis, start, stop, tuple(full)))
        else:
            out.append(Piece(path, None, 0, 0, tuple(shape)))
    return out


def optimizer_pieces(signature: list, model_signature: list) -> list[Piece]:
    """Pure function: each optimizer variable's `Piece`.

    Keras names a slot after its variable's path (`adam/ffn_in_kernel_0_momentum`
    for `ffn_in/kernel_0`), so a shard's slot is the same slice of the plain
    weight's slot (`ffn_in_kernel_momentum`). Keys drop the optimizer's own
    name, which Keras numbers per instance (adam, adam_1).
    """
    refs = {path.replace("/", "_"): piece
            for (path, *_), piece in zip(model_signature, model_pieces(model_signature))}
    out = []
    for path, shape, *_ in signature:
        key = path.split("/", 1)[-1]
        ref = max((r for r in refs if key.startswith(r + "_")), key=len, default=None)
        piece = refs.get(ref)
        if piece is None or list(shape) != _sliced_shape(piece):  # not a slot of its shape
            out.append(Piece(key, None, 0, 0, tuple(shape)))
            continue
        slot = piece.name.replace("/", "_") + key[len(ref):]
        out.append(Piece(slot, piece.axis, piece.start, piece.stop, piece.shape))
    return out


def _sliced_shape(piece: Piece) -> list:
    """The shape of the variable `piece` describes."""
    shape = list(piece.shape)
    if piece.axis is not None:
        shape[piece.axis] = piece.stop - piece.start
    return shape


def plan(got: list[Piece], want: list[Piece], what: str, path: str) -> list:
    """Pure function: for each wanted variable, its backup index, or an `Assemble`.

    Raises:
        CheckpointError: naming a weight the backup lacks, or pieces that do not
            make its whole shape.
    """
    by_name: dict[str, list] = {}
    for i, piece in enumerate(got):
        by_name.setdefault(piece.name, []).append((i, piece))
    out = []
    for piece in want:
        held = by_name.get(piece.name)
        if not held:
            raise CheckpointError(
                f"Backup {path} cannot be resumed: it holds no {what} variable "
                f"{piece.name!r} (nor its shards). Use the model that wrote it, or another "
                "--model-dir.")
        if held[0][1].shape != piece.shape:
            raise CheckpointError(
                f"Backup {path} cannot be resumed: {what} weight {piece.name!r} has shape "
                f"{list(piece.shape)} here but {list(held[0][1].shape)} in the backup.")
        whole = [i for i, p in held if p.axis is None]
        same = [i for i, p in held if (p.axis, p.start, p.stop) == (piece.axis, piece.start,
                                                                     piece.stop)]
        if same:  # this layout's own variable
            out.append(same[0])
            continue
        if whole:
            sources, join = (whole[0],), None
        else:
            join = held[0][1].axis
            parts = sorted(held, key=lambda ip: ip[1].start)
            covered = 0
            for _, p in parts:
                if p.axis != join or p.start != covered:
                    raise CheckpointError(
                        f"Backup {path} cannot be resumed: the shards of {what} weight "
                        f"{piece.name!r} do not make its shape {list(piece.shape)}.")
                covered = p.stop
            if covered != piece.shape[join]:
                raise CheckpointError(
                    f"Backup {path} cannot be resumed: the shards of {what} weight "
                    f"{piece.name!r} cover {covered} of {piece.shape[join]} on axis {join}.")
            sources = tuple(i for i, _ in parts)
        out.append(Assemble(sources, join, piece.axis, piece.start, piece.stop))
    return out


def assemble(step: Assemble, read):
    """The array of one variable, from the backup's entries (`read(index)`)."""
    import numpy as np

    arrays = [read(i) for i in step.sources]
    full = arrays[0] if step.join_axis is None else np.concatenate(arrays, axis=step.join_axis)
    if step.take_axis is None:
        return full
    return full[(slice(None),) * step.take_axis + (slice(step.start, step.stop),)]
