"""The final weights of a model larger than one process, written part by part.

A split model's plain form (`surgery.gather_model`) holds every weight in one
process, and `model.save` may buffer the file in memory too. Instead the run
writes the plain model's architecture (`model.json`, Keras's `to_json()`) and
Keras's sharded weights (`model.weights.json` and its `.weights.h5` shards):
Keras walks a valueless copy of the plain model (`deferred`) as it would to
save it, and each weight it reaches is read then, from the stage that holds it
(a tensor-parallel weight's shards joined), written, and dropped, so one weight
at a time passes through this process. Loadable with Keras alone:

    model = keras.models.model_from_json(open("model.json").read())
    model.load_weights("model.weights.json")

`final_form` picks it when the plain model would not fit the memory this
process has left; smaller models keep `model.keras`.
"""

from __future__ import annotations

import os

ARCHITECTURE = "model.json"
KERAS = "model.keras"
WEIGHTS = "model.weights.json"
SHARD_GB = 1.0  # largest .weights.h5 shard (Keras's max_shard_size, in GB)
HEADROOM_FACTOR = 3  # model.save holds the gathered weights, Keras's buffer and the file's


def values_of(model):
    """path -> a function giving that plain weight's value, for a model's variables.

    A tensor-parallel layer's shards (marked with the plain weight they slice,
    `TensorParallelLayer._annotate_shards`) are joined in order on their axis.
    """
    import numpy as np

    whole, shards = {}, {}
    for v in model.weights:
        plain = getattr(v, "_tfdist_plain", None)
        if plain is None:
            whole[v.path] = v
        elif plain[1] is None:
            whole[plain[0]] = v
        else:
            shards.setdefault(plain[0], []).append((plain[2], plain[1], v))
    out = {path: (lambda v=v: np.asarray(v.numpy())) for path, v in whole.items()}
    for path, parts in shards.items():
        parts.sort(key=lambda p: p[0])
        out[path] = lambda parts=parts: np.concatenate(
            [np.asarray(v.numpy()) for _, _, v in parts], axis=parts[0][1])
    return out


class _Resolving:
    """A Keras weights store whose variables are written as the values `read` gives."""

    def __init__(self, store, read):
        self._store, self._read = store, read

    def __setitem__(self, key, value):
        path = getattr(value, "path", None)
        self._store[key] = self._read[path]() if path in self._read else value

    def __getattr__(self, name):
        return getattr(self._store, name)


def _resolving_model(architecture: str, read: dict):
    """A valueless model of `architecture` whose layers save each weight as `read` gives it.

    Raises:
        ValueError: naming a weight of the architecture that `read` lacks.
    """
    import keras

    from tfdist.model_parallel import deferred

    plain = deferred.build_without_values(
        lambda: keras.models.model_from_json(architecture))
    missing = [v.path for v in plain.weights if v.path not in read]
    if missing:
        raise ValueError(f"The trained model holds no weight {missing[0]!r} of the plain "
                         f"model ({len(missing)} missing).")
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
        f.write(architecture)
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
