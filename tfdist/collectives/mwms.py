"""Host collectives between the tasks of a MultiWorkerMirroredStrategy.

MultiWorkerMirrored keeps its variables in sync itself, so what a process
needs from it is agreement (the preemption decision), a mean, a barrier
and, at `--shard parameters`, a broadcast of what one task holds alone; each
is one all-reduce compiled once per signature as a
tf.function (run eagerly, TensorFlow warns "Using CollectiveAllReduceStrategy
eagerly has significant overhead" at every call).
"""

from __future__ import annotations

import numpy as np

from tfdist.collectives import HostCollectives
from tfdist.compat.tf_peer_errors import lost_task
from tfdist.errors import PeerLostError


# `MWMSCollectives.broadcast`'s pieces: small arrays (a variable's index) padded to 1 Ki
# elements, others sent in 1 Mi-element pieces (4 MiB of float32).
_BROADCAST_SMALL = 1 << 10
_BROADCAST_CHUNK = 1 << 20


class MWMSCollectives(HostCollectives):
    """`HostCollectives` through a MultiWorkerMirroredStrategy's all-reduce.

    Rank and size come from the strategy's public `cluster_resolver`
    (chief first, then the workers, as TensorFlow orders tasks).

    Args:
        strategy: A `tf.distribute.MultiWorkerMirroredStrategy`.
    """

    def __init__(self, strategy):
        self.strategy = strategy
        resolver = strategy.cluster_resolver
        spec = resolver.cluster_spec().as_dict() if resolver is not None else {}
        tasks = [("chief", i) for i in range(len(spec.get("chief", [])))] + [
            ("worker", i) for i in range(len(spec.get("worker", [])))]
        self.task = (resolver.task_type, int(resolver.task_id or 0)) if resolver else None
        self.size = max(1, len(tasks))
        self.rank = tasks.index(self.task) if self.task in tasks else 0
        self._reduce = {}

    def _compiled(self, op: str, values):
        """The all-reduce of `values`' signature: one function per signature, each traced
        once (a retraced function would have TensorFlow warn)."""
        key = (op, tuple((tuple(v.shape), v.dtype.name) for v in values))
        if key not in self._reduce:
            import tensorflow as tf

            strategy = self.strategy
            reduce_op = getattr(tf.distribute.ReduceOp, op)

            @tf.function
            def reduce(values):
                per_replica = strategy.run(lambda v: [tf.identity(x) for x in v], args=(values,))
                # Every replica of a task holds the task's value: the mean over
                # replicas is the mean over tasks (each has as many replicas).
                return [strategy.reduce(reduce_op, x, axis=None) for x in per_replica]

            self._reduce[key] = reduce
        return self._reduce[key]

    def average(self, arrays) -> list:
        import tensorflow as tf

        values = [tf.constant(np.asarray(a)) for a in arrays]
        return [np.asarray(m.numpy()) for m in self._compiled("MEAN", values)(values)]

    def broadcast(self, arrays, root: int = 0) -> list:
        """Root's arrays on every task: root's values plus every other task's (negative)
        zeros.

        MultiWorkerMirrored keeps its variables identical itself; this carries
        what one task holds alone (its rows at `--shard parameters`, read for a
        backup). x + -0.0 is x exactly, so root's values arrive as they are. Each
        array goes in pieces of `_BROADCAST_SMALL` or `_BROADCAST_CHUNK`
        elements (the last zero-padded): two signatures per dtype, each traced
        once, however many shapes a backup reads. Needs one replica per task.
        """
        import tensorflow as tf

        out = []
        for a in arrays:
            a = np.asarray(a)
            # -0.0, not 0.0, for floats: x + -0.0 is x for every x, -0.0 included.
            zero = -0.0 if a.dtype.kind in "fc" else 0
            flat = a.reshape(-1) if self.rank == root else np.full(a.size, zero, a.dtype)
            width = _BROADCAST_SMALL if a.size <= _BROADCAST_SMALL else _BROADCAST_CHUNK
            got = np.empty(a.size, a.dtype)
            for lo in range(0, max(a.size, 1), width):
                k = min(width, a.size - lo)
                piece = np.full(width, zero, a.dtype)
                piece[:k] = flat[lo:lo + k]
                values = [tf.constant(piece)]
                (summed,) = self._compiled("SUM", values)(values)
                got[lo:lo + k] = summed.numpy()[:k]
            out.append(got.reshape(a.shape))
        return out

    def lost_peer(self, error: BaseException) -> PeerLostError | None:
        found = super().lost_peer(error)
        if found is None and self.task is not None:
            task = lost_task(str(error), self.task)
            if task is not None:
                return PeerLostError(str(error), rank=task[1], job=task[0])
        return found
