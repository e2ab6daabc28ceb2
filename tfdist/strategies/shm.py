"""`shm`: one replica per process on one host, gradients allreduced in shared memory.

Launch::

    python -m tfdist.launch -n 2 -- python -m tfdist.train RECIPE --strategy shm

or under `srun` on one node. As with Horovod, TensorFlow sees one replica
per process (its default strategy) and the data parallelism is tfdist's
(`tfdist.shm`): rank and size come from the cluster, each rank reads its
shard of every global batch, the optimizer averages gradients through the
shared segment, rank 0's initial state is broadcast, epoch metrics are
averaged and rank 0 is the chief. No TensorFlow server starts.
"""

from __future__ import annotations

from tfdist.strategies import Hooks


def check_available() -> None:
    """Fails before TensorFlow starts on a machine the engine does not support."""
    from tfdist.shm.comm import check_platform

    check_platform()


def build(cluster, options):
    """Joins the other ranks' shared segment; returns the default strategy.

    Raises:
        ClusterError: when the workers are not all on this host.
        PeerLostError: when a rank does not join within the timeout.
    """
    import tensorflow as tf

    from tfdist.shm import runtime

    if not runtime.is_initialized():  # build may run twice in one process
        runtime.init_from_cluster(cluster, options.timeout_s)
    return tf.distribute.get_strategy()


class ShmHooks(Hooks):
    """The trainer's hooks for shared-memory data parallelism."""

    def __init__(self, cluster):
        self.cluster = cluster

    def num_replicas(self, strategy) -> int:
        return self.cluster.num_workers

    def input_shard(self):
        return (self.cluster.num_workers, self.cluster.worker_index)

    def wrap_optimizer(self, optimizer):
        from tfdist import allreduce_optimizer
        from tfdist.shm import DistributedOptimizer
        from tfdist.shm.ops import all_true

        return allreduce_optimizer.loss_scale_if_float16(DistributedOptimizer(optimizer),
                                                         all_true)

    def compile_kwargs(self) -> dict:
        return {"jit_compile": False}  # the allreduce is a numpy_function

    def any_worker(self, strategy, flag):
        import numpy as np

        from tfdist.shm import runtime

        (total,) = runtime.communicator().allreduce([np.array([float(flag)])])
        return bool(total[0] > 0)

    def callbacks(self, cfg, learning_rate):
        from tfdist import shm

        # Broadcast first, so no other callback sees a rank's own random init.
        out = [shm.BroadcastInitialState(root=0), shm.MetricAverage()]
        if cfg.get("warmup_epochs"):
            # Goyal et al.'s ramp from lr/size, as under Horovod (the callback
            # needs Horovod only when no size is given).
            from tfdist.horovod.callbacks import LearningRateWarmup

            size = self.cluster.num_workers
            out.append(LearningRateWarmup(learning_rate / size, cfg["warmup_epochs"], size=size))
        return out


def hooks(cluster, options) -> Hooks:
    """The trainer hooks for this cluster."""
    return ShmHooks(cluster)
