"""The Keras callbacks of one-replica-per-process engines, written once on `HostCollectives`.

Horovod's `_keras` pattern: this private module holds the implementation;
`tfdist.horovod.callbacks` and `tfdist.shm.callbacks` are thin public
wrappers that name their engine. Each callback looks its collectives up
when training begins (`engine()`), so it may be built before the engine
is initialised.
"""

from __future__ import annotations

import keras
import numpy as np

from tfdist.allreduce_optimizer import state_variables
from tfdist.errors import CollectiveMismatchError

# The most bytes of state one broadcast call carries. Every value passes through a
# broadcast two to three times (this process's copy, the engine's tensor, the
# result); sent all at once, a Horovod rank of 4 Dense 4096x4096 + Adam (771 MiB of
# state) peaked 1.5 GB above its training level before the first step (3.78 GB
# against 2.24), a group at a time it does not (docs/benchmarks.md, #41).
BROADCAST_GROUP_BYTES = 64 << 20


def byte_groups(sizes: list[int], limit: int) -> list[range]:
    """Pure function: consecutive index ranges of `sizes`, each totalling at most
    `limit` bytes, or one item alone where that item is larger."""
    out, start, total = [], 0, 0
    for i, size in enumerate(sizes):
        if i > start and total + size > limit:
            out.append(range(start, i))
            start, total = i, 0
        total += size
    if start < len(sizes):
        out.append(range(start, len(sizes)))
    return out


def nbytes(variable) -> int:
    """A Keras or TensorFlow variable's bytes (its shape and dtype; every rank the same)."""
    import tensorflow as tf

    return int(np.prod(variable.shape, dtype=np.int64)) * tf.as_dtype(variable.dtype).size


def broadcast_groups(variables) -> list[list]:
    """`variables` in consecutive groups of at most BROADCAST_GROUP_BYTES (`byte_groups`),
    the same on every rank: broadcast one group at a time, so a rank holds no more
    than a group's copies."""
    variables = list(variables)
    return [[variables[i] for i in group]
            for group in byte_groups([nbytes(v) for v in variables], BROADCAST_GROUP_BYTES)]


def broadcast_state(model, optimizer, collectives, root: int = 0) -> None:
    """Sets the model's and optimizer's variables to rank `root`'s values.

    Builds the optimizer on the trainable variables first when needed, so its
    slots exist (and are broadcast) on every rank. Sent a group of at most
    BROADCAST_GROUP_BYTES at a time, so a rank holds no more than a group's copies.

    Args:
        model: A built Keras model.
        optimizer: Its optimizer; `model.optimizer` when None.
        collectives: The engine's `HostCollectives`.
        root: The rank whose state wins.
    """
    for group in broadcast_groups(state_variables(model, optimizer)):
        values = collectives.broadcast(
            [np.asarray(keras.ops.convert_to_numpy(v.value)) for v in group], root)
        for variable, value in zip(group, values):
            variable.assign(value)


def check_same_names(names: list[str], collectives, what: str) -> None:
    """Raises on every rank unless every rank passes the same `names` (in order).

    Rank 0's names are broadcast and each rank compares its own; the verdict
    is agreed (`all_true`), so either every rank goes on or every rank
    raises, and none is left waiting in a collective its peers never make.

    Raises:
        CollectiveMismatchError: naming rank 0's names and this rank's.
    """
    mine = np.frombuffer("\n".join(names).encode(), np.uint8)
    (length,) = collectives.broadcast([np.array([mine.size], np.int64)], 0)
    buffer = mine if collectives.rank == 0 else np.zeros(int(length[0]), np.uint8)
    (theirs,) = collectives.broadcast([buffer], 0)
    root_names = theirs.tobytes().decode().split("\n") if theirs.size else []
    if collectives.all_true(root_names == names):
        return
    if collectives.rank == 0:
        where = f"rank 0 has {names}, and another rank has different ones"
    else:
        where = f"rank 0 has {root_names}, rank {collectives.rank} has {names}"
    raise CollectiveMismatchError(
        f"{what} differ across ranks, so they cannot be averaged name by name: {where}. "
        "Every rank must compile the same metrics (a metric or a train_step log added on "
        "some ranks only?).")


def average_logs(logs: dict, collectives, what: str = "metrics") -> None:
    """Replaces each scalar in `logs` by its mean across ranks, in place.

    Raises:
        CollectiveMismatchError: when the ranks' scalar names differ.
    """
    names = sorted(n for n in logs  # sorted: the same order on every rank
                   if isinstance(logs[n], (int, float)) or getattr(logs[n], "shape", None) == ())
    check_same_names(names, collectives, what)
    if not names:
        return
    (mean,) = collectives.average([np.array([float(logs[n]) for n in names], np.float64)])
    for name, value in zip(names, mean):
        logs[name] = float(value)


class BroadcastInitialState(keras.callbacks.Callback):
    """Broadcasts model and optimizer variables from `root` when `fit` begins.

    `fit` builds the model and the optimizer before `on_train_begin`, so every
    variable exists by then; on a resumed run the state is whatever the root
    (the chief) restored before calling `fit`.

    Args:
        engine: A function returning the engine's `HostCollectives`.
        root: The rank whose state wins.
    """

    def __init__(self, engine, root: int = 0):
        super().__init__()
        self._engine, self._root = engine, root

    def on_train_begin(self, logs=None):
        broadcast_state(self.model, self.model.optimizer, self._engine(), self._root)


class MetricAverage(keras.callbacks.Callback):
    """Replaces each epoch-end metric by its mean across ranks (before History records it).

    Each rank's `fit` logs describe its own shard; Keras runs user callbacks
    before its History callback, so History, later callbacks and the chief's
    metrics file see the global value (with equal shards, exactly the
    single-replica epoch metric). The ranks' metric names are checked first:
    ranks that log different metrics all fail, naming them.

    Args:
        engine: A function returning the engine's `HostCollectives`.
    """

    def __init__(self, engine):
        super().__init__()
        self._engine = engine

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        average_logs(logs, self._engine(), f"the metrics logged at the end of epoch {epoch}")
