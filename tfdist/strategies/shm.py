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

from tfdist.strategies import Adapter, Hooks, ProcessReplicaHooks, register


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
        runtime.init_from_cluster(cluster, options.collective_timeout_s)
    return tf.distribute.get_strategy()


class ShmHooks(ProcessReplicaHooks):
    """The trainer's hooks for shared-memory data parallelism.

    Args:
        cluster: The discovered cluster.
        grad_compression: As `--grad-compression`.
        bucket_mb: As `--bucket-mb` (overlap buckets; 0: one all-reduce).
        shard: As `--shard` (`tfdist.zero`): "none", "optimizer", "gradients" or
            "parameters".
    """

    def __init__(self, cluster, grad_compression: str = "none", bucket_mb: float = 0.0,
                 shard: str = "none"):
        super().__init__(cluster, grad_compression, shard)
        self.bucket_mb = bucket_mb

    def _distributed(self, optimizer):
        from tfdist.shm import DistributedOptimizer

        return DistributedOptimizer(optimizer, bucket_mb=self.bucket_mb)

    def _owner_gather(self):
        from tfdist.shm.gather import OwnerGather

        return OwnerGather()

    def _scatter_engine(self):
        from tfdist.shm.scatter import ShmScatter

        return ShmScatter()

    def _all_true(self, flag):
        from tfdist.shm.ops import all_true

        return all_true(flag)

    def _engine_collectives(self):
        from tfdist.shm.collectives import ShmCollectives

        return ShmCollectives()

    def compile_kwargs(self) -> dict:
        return {"jit_compile": False}  # the allreduce is a numpy_function


@register
class Shm(Adapter):
    """Shared-memory data parallelism: one replica per process, all on one host."""

    name = "shm"
    portable = True
    accepts = ("collective_timeout_s", "grad_compression", "bucket_mb", "shard",
               "shard_optimizer_state")
    process_replicas = True
    sync_workers = True

    @classmethod
    def check_available(cls):
        check_available()

    @classmethod
    def check_config(cls, settings, cluster):
        super().check_config(settings, cluster)
        from tfdist import buckets
        from tfdist.zero import partition

        buckets.resolve(settings.adapter.bucket_mb, "shm")  # a bad size, refused
        partition.check_config(settings)
        if cluster.is_multi_worker:
            from tfdist.shm import runtime

            runtime.rendezvous_address(cluster)  # every worker on this host

    def build(self):
        return build(self.cluster, self.options)

    def hooks(self) -> Hooks:
        from tfdist import buckets
        from tfdist.zero import partition

        return ShmHooks(self.cluster, self.options.grad_compression,
                        buckets.resolve(self.options.bucket_mb, "shm"),
                        partition.level(self.options))
