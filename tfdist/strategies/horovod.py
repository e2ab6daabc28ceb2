"""`horovod`: one replica per process, gradients allreduced by Horovod.

Launch (each rank runs the same command)::

    horovodrun -np 4 -H localhost:4 --gloo python -m tfdist.train RECIPE --strategy horovod
    horovodrun -np 2 -H localhost:2 --mpi python -m tfdist.train RECIPE --strategy horovod

TensorFlow sees one replica (its default strategy); the data parallelism is
Horovod's, plugged into the trainer through `Hooks`: rank and size come from
the cluster (tfdist.cluster.horovod), each rank reads its shard of every
global batch, the optimizer is wrapped, rank 0's initial state is broadcast,
epoch metrics are averaged, and rank 0 is the chief that writes.
"""

from __future__ import annotations

from tfdist.errors import ClusterError
from tfdist.strategies import Adapter, Hooks, ProcessReplicaHooks, register


def check_available() -> None:
    """Fails before TensorFlow starts when Horovod is not installed."""
    from tfdist.horovod import runtime

    runtime.require()


def build(cluster, options):
    """Initialises Horovod, pins this rank's GPU, returns the default strategy.

    Raises:
        ConfigError: when Horovod is missing.
        ClusterError: when Horovod's rank/size disagree with the discovered cluster.
    """
    import tensorflow as tf

    from tfdist.horovod import runtime

    hvd = runtime.hvd()
    if (hvd.rank(), hvd.size()) != (cluster.worker_index, cluster.num_workers):
        raise ClusterError(
            f"Horovod says rank {hvd.rank()} of {hvd.size()}, but the environment "
            f"({cluster.source}) says worker {cluster.worker_index} of {cluster.num_workers}.\n"
            "HINT: start --strategy horovod jobs with `horovodrun` and no TF_CONFIG.")
    runtime.pin_device(hvd.local_rank())
    return tf.distribute.get_strategy()


class HorovodHooks(ProcessReplicaHooks):
    """The trainer's hooks for Horovod data parallelism."""

    def _distributed(self, optimizer):
        from tfdist.horovod import DistributedOptimizer

        return DistributedOptimizer(optimizer)

    def _all_true(self, flag):
        import tensorflow as tf

        from tfdist.horovod import runtime

        hvd = runtime.hvd()
        return hvd.allreduce(tf.cast(flag, tf.float32), op=hvd.Min,
                             name="tfdist_all_finite", ignore_name_scope=True) > 0.5

    def _owner_gather(self):
        from tfdist.horovod.gather import OwnerGather

        return OwnerGather()

    def _scatter_engine(self):
        from tfdist.horovod.scatter import HorovodScatter

        return HorovodScatter()

    def _engine_collectives(self):
        from tfdist.horovod.collectives import HorovodCollectives

        return HorovodCollectives()


@register
class Horovod(Adapter):
    """Horovod data parallelism: one replica per process, started by `horovodrun`."""

    name = "horovod"
    portable = True
    accepts = ("grad_compression", "shard", "shard_optimizer_state")
    process_replicas = True
    sync_workers = True

    @classmethod
    def check_available(cls):
        check_available()

    @classmethod
    def check_config(cls, settings, cluster):
        super().check_config(settings, cluster)
        from tfdist.zero import partition

        partition.check_config(settings)

    def build(self):
        return build(self.cluster, self.options)

    def hooks(self) -> Hooks:
        from tfdist.zero import partition

        return HorovodHooks(self.cluster, self.options.grad_compression,
                            partition.level(self.options))
