"""Host collectives between the tasks of a MultiWorkerMirroredStrategy.

MultiWorkerMirrored keeps its variables in sync itself, so what a process
needs from it is agreement (the preemption decision), a mean and a
barrier; each is one all-reduce compiled once per signature as a
tf.function (run eagerly, TensorFlow warns "Using CollectiveAllReduceStrategy
eagerly has significant overhead" at every call).
"""

from __future__ import annotations

import numpy as np

from tfdist.collectives import HostCollectives
from tfdist.compat.tf_peer_errors import lost_task
from tfdist.errors import PeerLostError


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
        self._mean = None

    def _compiled_mean(self):
        if self._mean is None:
            import tensorflow as tf

            strategy = self.strategy

            @tf.function
            def mean(values):
                per_replica = strategy.run(lambda v: [tf.identity(x) for x in v], args=(values,))
                # Every replica of a task holds the task's value: the mean over
                # replicas is the mean over tasks (each has as many replicas).
                return [strategy.reduce(tf.distribute.ReduceOp.MEAN, x, axis=None)
                        for x in per_replica]

            self._mean = mean
        return self._mean

    def average(self, arrays) -> list:
        import tensorflow as tf

        values = [tf.constant(np.asarray(a)) for a in arrays]
        return [np.asarray(m.numpy()) for m in self._compiled_mean()(values)]

    def broadcast(self, arrays, root: int = 0) -> list:
        raise NotImplementedError(
            "MultiWorkerMirroredStrategy keeps its variables identical on every task itself; "
            "tfdist needs no broadcast under it.")

    def lost_peer(self, error: BaseException) -> PeerLostError | None:
        found = super().lost_peer(error)
        if found is None and self.task is not None:
            task = lost_task(str(error), self.task)
            if task is not None:
                return PeerLostError(str(error), rank=task[1], job=task[0])
        return found
