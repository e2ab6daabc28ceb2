"""`parameter_server`: asynchronous training with ParameterServerStrategy.

Only the chief (the coordinator) builds this strategy; workers and ps tasks
run plain `tf.distribute.Server`s (see `tfdist.ps.server`). The training loop
is `tfdist.run.coordinator`, because Keras 3 `fit` has no path for this
strategy: Keras 3 removed `keras.utils.experimental.DatasetCreator`, which
Keras 2's `fit` needed for it, and "parameter server training is not supported
in Keras 3" (keras-team/keras#18624, maintainer's answer).
"""

from __future__ import annotations

from tfdist.errors import ClusterError
from tfdist.strategies import Adapter, register

PS_TASK_TYPES = ("chief", "worker", "ps")


def build(cluster, options):
    """ParameterServerStrategy for a cluster with a chief, workers and ps tasks.

    Args:
        cluster: ClusterInfo of the chief; its `tf_config` lists every task.
        options: StrategyOptions; `ps_shards` > 1 splits each large variable
            along its first axis into up to that many shards on different ps
            tasks (`min_shard_bytes` per shard at least), for big embeddings.
            This works for plain tf.Variables; Keras 3 layers cannot train over
            the resulting ShardedVariables (see `tfdist.ps.check_partitioning`).

    Raises:
        ClusterError: when this process is not the chief of a PS cluster.
    """
    import tensorflow as tf

    if cluster.tf_config is None or "ps" not in cluster.tf_config["cluster"]:
        raise ClusterError(
            "strategy parameter_server needs a cluster with 'ps' tasks. Received: "
            f"{None if cluster.tf_config is None else sorted(cluster.tf_config['cluster'])}.\n"
            "HINT: python -m tfdist.launch --ps 1 --workers 2 -- python -m tfdist.train "
            "RECIPE --strategy parameter_server")
    spec = {k: v for k, v in cluster.tf_config["cluster"].items() if k in PS_TASK_TYPES}
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type=cluster.task_type, task_id=cluster.task_index,
        rpc_layer="grpc")
    partitioner = None
    if options.ps_shards > 1:
        partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=options.min_shard_bytes, max_shards=options.ps_shards)
    return tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)


@register
class ParameterServer(Adapter):
    """Asynchronous training: the chief coordinates, workers compute, ps tasks hold variables."""

    name = "parameter_server"
    loop = "coordinator"
    accepts = ("ps_shards", "min_shard_bytes")
    refuses = {
        "accumulate": (1, "each worker applies its own gradients to the ps as soon as they are "
                          "computed (asynchronous SGD); there is no global step to accumulate "
                          "over"),
        "deterministic": (False, "asynchronous steps run in whatever order the workers finish, "
                                 "so no run is repeatable"),
        "inter_op_threads": (0, "a worker's remote step holds an inter-op thread while it waits "
                                "for its input, so a small pool would deadlock it; use --threads"),
        "rescale_lr_on_batch_change": (False, "the coordinator resumes whole epochs from its "
                                              "backup and cannot re-position the data at another "
                                              "global batch; finish the run at the backup's batch"),
    }

    @classmethod
    def check_config(cls, settings, cluster):
        super().check_config(settings, cluster)
        from tfdist import ps

        ps.check_cluster(cluster)
        ps.check_partitioning(settings.adapter.ps_shards)

    @classmethod
    def runs_loop(cls, cluster):
        return cluster.task_type == "chief"  # workers and ps tasks serve

    def build(self):
        from tfdist.compat import grpc_keepalive

        # Before the strategy opens channels to the tasks: a worker whose host
        # vanishes must fail its pending step, not hold it for ~15 minutes.
        grpc_keepalive.apply()
        return build(self.cluster, self.options)

    def serve(self, threads: int = 0):
        """A worker or ps task: serves the chief's steps or variables until the chief has
        gone (never returns).

        Raises:
            ClusterError: for a task type with no role in this job.
        """
        if self.cluster.task_type not in ("worker", "ps"):
            raise ClusterError(f"task type {self.cluster.task_type!r} has no role in "
                               "parameter-server training; valid: chief, worker, ps.")
        from tfdist.ps import server

        return server.serve(self.cluster, threads)
