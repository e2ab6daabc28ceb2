"""The final weights of a model larger than one process, written part by part.

A split model's plain form (`surgery.gather_model`) holds every weight in one
process, and `model.save` may buffer the file in memory too. Instead the run
writes the plain model's architecture (`model.json`, Keras's `to_json()`) and
Keras's sharded weights (`model.weights.json` and its `.weights.h5` shards):
Keras walks a valueless copy of the plain model (`deferred`) as it would to
save it, and each weight it reaches is read then, from the stage that holds it
(a tensor-parallel weight's shards joined), written, and dropped. Only a piece
of one weight at a time passes through this process: each is written into its
HDF5 dataset a block of rows (at most PIECE_BYTES) at a time, each block sliced
on the task that holds the variable (`compat.keras_h5_copies.write_in_pieces`).
Where that cannot be done (model.keras, bfloat16, another Keras) the whole
value passes, once (`keras_h5_copies.one_copy`: Keras's H5 stores copy each
value twice; #40: a 4096x4096 kernel had been in the chief three times at
once, and the remote ones' receive buffers left resident). Loadable
with Keras alone:

    model = keras.models.model_from_json(open("model.json").read())
    model.load_weights("model.weights.json")

`final_form` picks it when the plain model would not fit the memory this
process has left; smaller models keep `model.keras`.
"""

from __future__ import annotations

import json
import os

from tfdist import heap
from tfdist.compat import keras_h5_copies

ARCHITECTURE = "model.json"
KERAS = "model.keras"
WEIGHTS = "model.weights.json"
SHARD_GB = 1.0  # largest .weights.h5 shard (Keras's max_shard_size, in GB)
# The most of one weight sent here at once from another task. #40, the chief of 4
# stages of 13 x 4096 + Adam, its final save sampled every 50 ms: with 4 MiB pieces
# it peaked 42 MiB above the level the save began at (a piece's receive buffers are
# several times its size), with 2 MiB 20 MiB in the same 2.9 s, with 1 MiB 7 MiB.
PIECE_BYTES = 2 << 20
HEADROOM_FACTOR = 3  # model.save holds the gathered weights, Keras's buffer and the file's


def row_blocks(shape, itemsize: int, piece_bytes: int) -> list[tuple[int, int]]:
    """Pure function: [(start, stop)] along axis 0 of an array of `shape`, each block at
    most `piece_bytes` (one row at least); [(0, 0)] for a scalar (read whole)."""
    if not shape:
        return [(0, 0)]
    row = itemsize
    for n in shape[1:]:
        row *= int(n)
    rows = max(1, piece_bytes // row) if row else max(1, int(shape[0]))
    return [(a, min(a + rows, int(shape[0]))) for a in range(0, int(shape[0]), rows)] or [(0, 0)]


def _handle(variable):
    """The tf.Variable under a Keras variable (it carries the device)."""
    return getattr(variable, "value", variable) if hasattr(variable, "path") else variable


class _Weight:
    """One plain weight of a trained model: its variable, or a tensor-parallel layer's
    shards of it joined on `axis`, read a block of rows at a time where each lives.

    Called, it gives the whole value (one array); `write(dataset)` puts it into an
    array-like of its shape (an HDF5 dataset) a piece at a time instead, so at
    most `piece_bytes` of it is in this process at once.
    """

    def __init__(self, parts, axis: int | None, piece_bytes: int):
        self.parts, self.axis, self.piece_bytes = parts, axis, piece_bytes
        handle = _handle(parts[0])
        self.dtype = handle.dtype.as_numpy_dtype
        shape = [int(n) for n in parts[0].shape]
        if axis is not None:
            shape[axis] = sum(int(v.shape[axis]) for v in parts)
        self.shape = tuple(shape)

    @property
    def nbytes(self) -> int:
        import numpy as np

        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def pieces(self):
        """Yields (index into the whole value, that piece as an array), in order."""
        import numpy as np
        import tensorflow as tf

        offset = 0
        for v in self.parts:
            handle = _handle(v)
            shape = tuple(int(n) for n in v.shape)
            n = shape[self.axis] if self.axis is not None else 0
            with tf.device(handle.device):
                for a, b in row_blocks(shape, np.dtype(self.dtype).itemsize,
                                       self.piece_bytes):
                    if not shape:
                        yield (), np.asarray(handle.numpy())
                        continue
                    rows = slice(a, b)
                    if self.axis == 0:
                        index = (slice(offset + a, offset + b),)
                    elif self.axis is not None:
                        index = ((rows,) + (slice(None),) * (self.axis - 1)
                                 + (slice(offset, offset + n),))
                    else:
                        index = (rows,)
                    piece = handle[a:b] if (a, b) != (0, shape[0]) else handle.value()
                    yield index, np.asarray(piece.numpy())
                    del piece
            offset += n

    def write(self, target) -> None:
        """Writes the value into `target` (an array-like of this shape), piece by piece."""
        for index, piece in self.pieces():
            target[index if index else ...] = piece

    def __call__(self):
        import numpy as np

        out = np.empty(self.shape, self.dtype)
        self.write(out)
        return out


def values_of(model, piece_bytes: int = PIECE_BYTES):
    """path -> that plain weight (`_Weight`: called, its value), for a model's variables.

    Each is read `piece_bytes` at a time: a weight on another task reaches this
    process in pieces, not as one message of its whole size. A tensor-parallel
    layer's shards (marked with the plain weight they slice,
    `TensorParallelLayer._annotate_shards`) are read into their places on their
    axis.
    """
    whole, shards = {}, {}
    for v in model.weights:
        plain = getattr(v, "_tfdist_plain", None)
        if plain is None:
            whole[v.path] = v
        elif plain[1] is None:
            whole[plain[0]] = v
        else:
            shards.setdefault(plain[0], []).append((plain[2], plain[1], v))
    out = {path: _Weight([v], None, piece_bytes) for path, v in whole.items()}
    for path, parts in shards.items():
        parts.sort(key=lambda p: p[0])
        out[path] = _Weight([v for _, _, v in parts], parts[0][1], piece_bytes)
    return out


class Lazy:
    """A weight's value, read when called; its shape known before (`weight_keys`)."""

    def __init__(self, shape, read):
        self.shape, self._read = tuple(int(n) for n in shape), read

    def __call__(self):
        return self._read()


class _Resolving:
    """A Keras weights store whose variables are written as the values `read` gives."""

    def __init__(self, store, read):
        self._store, self._read = store, read

    def __setitem__(self, key, value):
        path = getattr(value, "path", None)
        if path not in self._read:
            self._store[key] = value
            return
        weight = self._read[path]
        if not (isinstance(weight, _Weight)
                and keras_h5_copies.write_in_pieces(self._store, key, weight)):
            self._store[key] = weight()
        heap.trim()  # the pieces' buffers' pages, before the next weight's

    def __getattr__(self, name):
        return getattr(self._store, name)


def plain_architecture(architecture: str) -> str:
    """Pure function: a model's `to_json()` without its compile config.

    A compiled model's JSON carries its loss and optimizer; deserialising it
    builds the optimizer's variables, which a valueless model (`deferred`)
    cannot hold, and a wrapped optimizer (Horovod's, shm's, tfdist's) is no
    class plain Keras knows. The weights need the layers alone.
    """
    config = json.loads(architecture)
    if isinstance(config, dict) and "compile_config" in config:
        config = {k: v for k, v in config.items() if k != "compile_config"}
        return json.dumps(config)
    return architecture


def weight_keys(plain: list, read: dict, model_name: str) -> dict[str, str]:
    """Pure function: each path of the model deserialised from the architecture -> the
    key of `read` that holds its value; paths nothing matches are left out.

    Keras names a weight by the name scope it was built in: a Sequential built by
    a recipe names its weights `NAME/layer/var`, the same model deserialised
    `layer/var` (Functional models `layer/var` both ways), and a subclassed
    model's layers made in its `__init__` get new automatic names when it is
    deserialised (`dense` becomes `dense_2`). So a path is matched as it is, else
    with the model's name as first part taken off both sides (where that leaves
    every key distinct); where some are still unmatched and both list the same
    number of weights, of the same shapes in the same order (Keras's own saving
    goes by that order), they are matched by position.

    Args:
        plain: (path, shape) of each weight of the deserialised model, in order.
        read: key -> shape (a tuple, or None where unknown) of each value, in the
            trained model's order.
        model_name: The model's name.
    """
    keys = list(read)
    out = {p: p for p, _ in plain if p in read}
    prefix = f"{model_name}/"

    def bare(path):
        return path[len(prefix):] if path.startswith(prefix) else path

    stripped: dict[str, str] = {}
    for key in keys:
        stripped.setdefault(bare(key), key)
    if len(stripped) == len(keys):  # two keys alike without the name: no guessing
        for p, _ in plain:
            if p not in out and bare(p) in stripped:
                out[p] = stripped[bare(p)]
    if len(out) < len(plain) and len(plain) == len(keys) and all(
            read[k] is not None and tuple(read[k]) == tuple(shape)
            for (_, shape), k in zip(plain, keys)):
        return {p: k for (p, _), k in zip(plain, keys)}
    return out


def _resolving_model(architecture: str, read: dict):
    """A valueless model of `architecture` whose layers save each weight as `read` gives it.

    Raises:
        ValueError: naming a weight of the architecture that `read` lacks.
    """
    import keras

    from tfdist.model_parallel import deferred

    plain = deferred.build_without_values(
        lambda: keras.models.model_from_json(plain_architecture(architecture)))
    keys = weight_keys([(v.path, tuple(v.shape)) for v in plain.weights],
                       {k: getattr(w, "shape", None) for k, w in read.items()}, plain.name)
    missing = [v.path for v in plain.weights if v.path not in keys]
    if missing:
        raise ValueError(f"The trained model holds no weight {missing[0]!r} of the plain "
                         f"model ({len(missing)} missing).")
    read = {p: read[k] for p, k in keys.items()}
    for layer in plain._flatten_layers(include_self=True):
        own = type(layer).save_own_variables
        layer.save_own_variables = (
            lambda store, layer=layer, own=own: own(layer, _Resolving(store, read)))
    return plain


def save_sharded(architecture: str, read: dict, directory: str) -> list[str]:
    """Writes ARCHITECTURE and WEIGHTS (with its shards) into `directory`.

    Args:
        architecture: The plain model's `to_json()`.
        read: As `values_of` returns: every plain weight's path -> its value.
        directory: Where the files go (an empty temporary one: the caller moves them).

    Returns:
        The file names written, the index (WEIGHTS) last.

    Raises:
        ValueError: naming a weight of the architecture that `read` lacks.
    """
    plain = _resolving_model(architecture, read)
    with open(os.path.join(directory, ARCHITECTURE), "w", encoding="utf-8") as f:
        f.write(plain_architecture(architecture))  # loads with Keras alone, uncompiled
    with keras_h5_copies.one_copy(PIECE_BYTES):
        plain.save_weights(os.path.join(directory, WEIGHTS), max_shard_size=SHARD_GB)
    names = sorted(os.listdir(directory))
    return [n for n in names if n != WEIGHTS] + [WEIGHTS]


def save_keras(architecture: str, read: dict, directory: str) -> list[str]:
    """Writes the plain model as `model.keras` into `directory`, each weight from `read`.

    As `save_sharded`, but one file: Keras's own zip, uncompiled (no optimizer).

    Returns:
        ["model.keras"].
    """
    plain = _resolving_model(architecture, read)
    with keras_h5_copies.one_copy(PIECE_BYTES):
        plain.save(os.path.join(directory, KERAS))
    return [KERAS]


def sharded_files(directory: str) -> list[str]:
    """The sharded form's files in `directory` (ARCHITECTURE, WEIGHTS, its shards)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    stem = WEIGHTS.replace(".weights.json", "")
    return [n for n in names if n in (ARCHITECTURE, WEIGHTS)
            or (n.startswith(stem + "_") and n.endswith(".weights.h5"))]


def weight_bytes(model) -> int:
    """Bytes of a model's weights (each variable counted once)."""
    import numpy as np

    from tfdist import parameters

    unique = {id(v): v for v in model.weights}.values()
    return sum(parameters.count([v]) * np.dtype(v.dtype).itemsize for v in unique)


def final_form(asked: str, plain_bytes: int, headroom: int | None) -> str:
    """Pure function: "keras" (model.keras) or "sharded" (model.json + sharded weights).

    Args:
        asked: --final-weights: "auto", "keras" or "sharded".
        plain_bytes: The plain model's weights.
        headroom: `memory_limit.headroom_bytes()` (None: unknown, keep model.keras).
    """
    if asked != "auto":
        return asked
    if headroom is not None and HEADROOM_FACTOR * plain_bytes > headroom:
        return "sharded"
    return "keras"
