"""`multi_worker`: one replica group across processes (MultiWorkerMirroredStrategy)."""

from __future__ import annotations

from tfdist.errors import ConfigError

IMPLEMENTATIONS = ("auto", "ring", "nccl")


def communication_options(collective: str, timeout_s: float | None):
    """CommunicationOptions for MWMS.

    A timeout makes a collective whose peer died fail instead of waiting
    forever; MWMS's own health checks then abort the remaining collectives.
    """
    import tensorflow as tf

    impl = {"auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
            "ring": tf.distribute.experimental.CommunicationImplementation.RING,
            "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL}
    if collective not in impl:
        raise ConfigError(f"collective must be one of {list(IMPLEMENTATIONS)}. "
                          f"Received: collective={collective!r}.")
    return tf.distribute.experimental.CommunicationOptions(
        implementation=impl[collective], timeout_seconds=timeout_s or None)


def build(cluster, options):
    """MultiWorkerMirroredStrategy for the discovered cluster.

    The cluster is handed to TensorFlow as a resolver built from
    `cluster.tf_config`, so discovery from SLURM needs no TF_CONFIG variable.
    """
    import tensorflow as tf

    resolver = None
    if cluster.tf_config is not None:
        spec = {k: v for k, v in cluster.tf_config["cluster"].items()
                if k in ("chief", "worker")}
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(spec), task_type=cluster.task_type,
            task_id=cluster.task_index, rpc_layer="grpc")
    return tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver,
        communication_options=communication_options(options.collective, options.timeout_s))
