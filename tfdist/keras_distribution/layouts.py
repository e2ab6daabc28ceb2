"""What a `keras.distribution.LayoutMap` asks of each weight, as tfdist can do it (pure, no TensorFlow).

Keras writes a weight's layout as one mesh axis name (or None) per
dimension: a Dense kernel `(None, "model")` is split on its output axis over
the mesh's "model" devices, `("model", None)` on its input axis. tfdist
honours those with its tensor-parallel layers: a kernel split on its output
axis becomes a `ColumnParallelDense` (its bias split with it), one split on
its input axis a `RowParallelDense` (one bias, on the first device). Every
other split is refused with one line naming the variable, its layout and
what works, before anything trains: nothing is silently ignored.
"""

from __future__ import annotations

import dataclasses

from tfdist.errors import ConfigError

WHAT_WORKS = ("What works: a Dense kernel split on one axis over the model axis, "
              "(None, 'model') (column-parallel, its bias ('model',) or unsplit) or "
              "('model', None) (row-parallel, its bias unsplit); every other weight unsplit.")


@dataclasses.dataclass(frozen=True)
class Weight:
    """One model variable as the planner sees it.

    Attributes:
        path: Keras's variable path ("d1/kernel").
        shape: Its shape.
        layer: The owning layer's name.
        kind: The owning layer's class name ("Dense", ...).
        axes: The layout's axes (None per unsplit dimension), or None when
            the LayoutMap has no entry for it.
    """

    path: str
    shape: tuple
    layer: str
    kind: str
    axes: tuple | None


@dataclasses.dataclass(frozen=True)
class Split:
    """A layer made tensor-parallel: its role ("column" or "row") over a mesh axis."""

    layer: str
    role: str
    axis: str


def _split_axes(weight: Weight, mesh: dict[str, int]) -> list[tuple[int, str]]:
    """(dimension, mesh axis) for each dimension split over an axis of more than one device."""
    if weight.axes is None:
        return []
    axes = weight.axes
    if len(axes) != len(weight.shape):
        raise ConfigError(
            f"The layout of {weight.path!r} has {len(axes)} axes {tuple(axes)} for a weight of "
            f"shape {tuple(weight.shape)}: give one mesh axis name (or None) per dimension.")
    named = [a for a in axes if a is not None]
    for a in named:
        if named.count(a) > 1:
            raise ConfigError(
                f"The layout of {weight.path!r}, {tuple(axes)}, uses mesh axis {a!r} for two "
                f"dimensions: a weight can be split over each mesh axis once. {WHAT_WORKS}")
    return [(dim, a) for dim, a in enumerate(axes) if a is not None and mesh.get(a, 1) > 1]


def plan(weights: list[Weight], mesh: dict[str, int], batch_axis: str | None,
         processes: int = 1) -> list[Split]:
    """The tensor-parallel layers a layout map asks for, or one ConfigError saying why not.

    Args:
        weights: Every variable of the model, with its layout.
        mesh: Mesh axis name -> number of devices along it.
        batch_axis: The distribution's batch (data-parallel) axis name.
        processes: Processes the mesh spans.

    Returns:
        One `Split` per layer whose kernel is split, in the model's order.

    Raises:
        ConfigError: for a layout tfdist cannot honour.
    """
    splits: dict[str, Split] = {}
    for w in weights:
        dims = _split_axes(w, mesh)
        if not dims:
            continue
        dim, axis = dims[0]
        if axis == batch_axis:
            raise ConfigError(
                f"The layout of {w.path!r}, {tuple(w.axes)}, splits a weight over the batch "
                f"axis {axis!r}: that is fully sharded data parallel (ZeRO-3), which tfdist "
                f"does not have yet. Leave the weight unsplit over {axis!r}. {WHAT_WORKS}")
        if len(dims) > 1:
            raise ConfigError(
                f"The layout of {w.path!r}, {tuple(w.axes)}, splits it on {len(dims)} dimensions; "
                f"tfdist splits a weight on one. {WHAT_WORKS}")
        name = w.path.rsplit("/", 1)[-1]
        if w.kind != "Dense" or name != "kernel" or len(w.shape) != 2:
            if w.kind == "Dense" and name == "bias":
                continue  # checked against its kernel below
            raise ConfigError(
                f"The layout of {w.path!r} ({w.kind} weight of shape {tuple(w.shape)}), "
                f"{tuple(w.axes)}, cannot be honoured: tfdist splits Dense kernels only. "
                f"{WHAT_WORKS}")
        if processes > 1:
            raise ConfigError(
                f"The layout of {w.path!r}, {tuple(w.axes)}, splits a weight over {axis!r}, and "
                f"the mesh spans {processes} processes: tfdist splits weights over one process's "
                "devices only. Use DataParallel across processes, or ModelParallel in one "
                "process.")
        splits[w.layer] = Split(w.layer, "column" if dim == 1 else "row", axis)
    _check_biases(weights, mesh, splits)
    return [splits[w.layer] for w in weights if w.layer in splits
            and w.path.endswith("/kernel")]


def _check_biases(weights, mesh, splits) -> None:
    """A split bias must belong to a column-parallel kernel split over the same axis."""
    for w in weights:
        if w.kind != "Dense" or not w.path.endswith("/bias"):
            continue
        dims = _split_axes(w, mesh)
        if not dims:
            continue
        split = splits.get(w.layer)
        if split is None or split.role != "column" or split.axis != dims[0][1]:
            how = ("its kernel is not split" if split is None else
                   f"its kernel is split on its {'input' if split.role == 'row' else 'output'} "
                   f"axis over {split.axis!r}")
            raise ConfigError(
                f"The layout of {w.path!r}, {tuple(w.axes)}, splits a bias, but {how}: a bias "
                f"is split only with a kernel split on its output axis over the same mesh axis. "
                f"{WHAT_WORKS}")

