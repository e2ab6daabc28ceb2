"""`multi_worker`: one replica group across processes (MultiWorkerMirroredStrategy).

Start-up is bounded: a busy port of this task is a ClusterError before
TensorFlow starts; a worker waits for the coordination-service leader's port
in Python, where SIGTERM still ends it at once, and then registers with a
deadline (`cluster_register_timeout_in_ms`), so a peer that never comes ends
the job within `startup_timeout_s` instead of blocking in
`CoordinationServiceAgent::Connect` for ever.

Inside TensorFlow's connect a signal is not acted on at once: building the
strategy blocks holding the GIL, so no Python code can run until it connects
or the deadline passes (measured: TF 2.21); that phase is bounded by
`startup_timeout_s`, not by the signal. Under `python -m tfdist.train` the
signal is not lost there: SIGTERM and SIGINT are blocked in every thread and
taken by `tfdist.preemption.catch_signals`, so TensorFlow's C++ SIGTERM handler
(`SigtermNotifier`, installed here; it only logs) never runs, and the run stops
with a backup at its first agreed step.
"""

from __future__ import annotations

import errno
import socket
import time

from tfdist import buckets
from tfdist.errors import ClusterError, ConfigError, PeerLostError
from tfdist.ps.net import reachable
from tfdist.strategies import Adapter, Hooks, register
from tfdist.strategies.options import IMPLEMENTATIONS


def communication_options(collective: str, timeout_s: float | None, bucket_mb: float = 0.0):
    """CommunicationOptions for MWMS.

    A timeout makes a collective whose peer died fail instead of waiting
    forever; MWMS's own health checks then abort the remaining collectives.

    `bucket_mb` becomes `bytes_per_pack`: TensorFlow's `CollectiveAllReduce`
    then reverses the gradient list (last layer first, the order the backward
    pass makes them) and launches one all-reduce per pack, each as soon as its
    own gradients exist, so communication overlaps the rest of the backward
    pass. With 0 (TensorFlow's default) every gradient goes in one pack, which
    waits for the whole backward pass.
    """
    import tensorflow as tf

    impl = {"auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
            "ring": tf.distribute.experimental.CommunicationImplementation.RING,
            "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL}
    if collective not in impl:
        raise ConfigError(f"collective must be one of {list(IMPLEMENTATIONS)}. "
                          f"Received: collective={collective!r}.")
    return tf.distribute.experimental.CommunicationOptions(
        implementation=impl[collective], timeout_seconds=timeout_s or None,
        bytes_per_pack=buckets.bucket_bytes(bucket_mb))


def own_address(cluster) -> str | None:
    """'host:port' this task's TensorFlow server will listen on, if known."""
    spec = (cluster.tf_config or {}).get("cluster", {})
    tasks = spec.get(cluster.task_type, [])
    return tasks[cluster.task_index] if cluster.task_index < len(tasks) else None


def leader_address(cluster) -> str | None:
    """'host:port' of the coordination-service leader: the chief, else worker 0."""
    addresses = cluster.worker_addresses
    return addresses[0] if addresses else None


_HINT = ("HINT: every address in TF_CONFIG must be a free port on its host; pick free ports "
         "(tfdist.launch does) or stop the program that holds it (ss -ltnp).")


def check_own_port(cluster) -> None:
    """Refuses a port another program already listens on (before TensorFlow starts).

    TensorFlow's gRPC server binds every interface with SO_REUSEADDR, so the
    probe does the same.

    Raises:
        ClusterError: naming host:port.
    """
    address = own_address(cluster)
    if not cluster.is_multi_worker or not address:
        return
    host, _, port = address.rpartition(":")
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind(("", int(port)))
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            return  # not ours to judge (e.g. a port we may not bind): TensorFlow reports it
        raise ClusterError(
            f"{cluster.task_type} {cluster.task_index} cannot listen on {host}:{port}: the port "
            f"is in use by another program.\n{_HINT}") from None
    finally:
        probe.close()


def wait_for_leader(cluster, timeout_s: float, poll_s: float = 0.2) -> None:
    """Non-leaders: waits until the leader's port accepts connections.

    Raises:
        PeerLostError: naming the leader when it does not within `timeout_s`.
        Preempted: when SIGTERM or SIGINT came meanwhile (`tfdist.preemption`).
    """
    address = leader_address(cluster)
    if not cluster.is_multi_worker or not address or cluster.worker_index == 0:
        return
    from tfdist import preemption

    deadline = time.monotonic() + timeout_s
    while not reachable(address, 1.0):
        caught = preemption.current()
        if caught is not None and caught.requested:
            # Recorded, not acted on by default (`catch_signals`): no peer, so no step
            # to agree on; stop now, as the signal's own action would have.
            raise preemption.Preempted(
                f"{caught.cause} while waiting for worker 0 ({address}) to start: no step "
                "trained, nothing saved; rerun to start", None, interrupted=caught.interrupted)
        if time.monotonic() > deadline:
            raise PeerLostError(
                f"worker 0 ({address}) did not start within --startup-timeout-s "
                f"{timeout_s:g}: it may have failed, or never been started.\n{_HINT}",
                rank=0, address=address)
        time.sleep(poll_s)


def _configure_coordination(tf, spec, timeout_s: float) -> None:
    # The same service MultiWorkerMirroredStrategy configures for itself (it
    # keeps one configured before it), plus a deadline for registering with it.
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    if context.context().coordination_service is not None:
        return
    jobs = [j for j in ("chief", "worker") if j in spec.jobs]
    from tensorflow.python.distribute.collective_all_reduce_strategy import (
        coordination_config_pb2)

    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(spec),
        coordinated_jobs=[coordination_config_pb2.CoordinatedJob(
            name=j, num_tasks=spec.num_tasks(j)) for j in jobs],
        cluster_register_timeout_in_ms=int(timeout_s * 1000))


def build(cluster, options):
    """MultiWorkerMirroredStrategy for the discovered cluster.

    The cluster is handed to TensorFlow as a resolver built from
    `cluster.tf_config`, so discovery from SLURM needs no TF_CONFIG variable.

    Raises:
        ClusterError: when this task's server cannot start (a busy port).
        PeerLostError: when the leader does not come up, or a worker does not
            register, within `options.startup_timeout_s`.
    """
    import tensorflow as tf

    from tfdist.compat import keras_grad_reduction

    keras_grad_reduction.set_compression(options.grad_compression)
    resolver = None
    timeout_s = options.startup_timeout_s
    if cluster.tf_config is not None:
        spec = tf.train.ClusterSpec({k: v for k, v in cluster.tf_config["cluster"].items()
                                     if k in ("chief", "worker")})
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            spec, task_type=cluster.task_type, task_id=cluster.task_index, rpc_layer="grpc")
        if cluster.is_multi_worker and timeout_s:
            _configure_coordination(tf, spec, timeout_s)
            wait_for_leader(cluster, timeout_s)
    try:
        return tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver,
            communication_options=communication_options(
                options.collective, options.collective_timeout_s,
                buckets.resolve(options.bucket_mb, "multi_worker")))
    except tf.errors.DeadlineExceededError as e:
        raise PeerLostError(
            f"{cluster.task_type} {cluster.task_index}: the workers did not all register with "
            f"the coordination service at {leader_address(cluster)} within "
            f"--startup-timeout-s {timeout_s:g} ({str(e).splitlines()[0][:200]}).\n{_HINT}",
            rank=0, address=leader_address(cluster)) from None
    except tf.errors.UnknownError as e:
        if "Could not start gRPC server" not in str(e):
            raise
        raise ClusterError(f"{cluster.task_type} {cluster.task_index} cannot listen on "
                           f"{own_address(cluster)}: {str(e).splitlines()[0][:200]}\n{_HINT}") from None


class MultiWorkerHooks(Hooks):
    """The trainer's hooks under MultiWorkerMirroredStrategy: with `shard` "optimizer", the
    optimizer keeps the state of this worker's variables only (`tfdist.zero.mwms`) and
    each worker receives the summed gradients of those (`tfdist.zero.scatter`); with
    "gradients", it keeps only those sums and accumulators too (`tfdist.zero.gradients`);
    either way a mixed-precision skip is agreed by every worker (their finite checks see
    different parts)."""

    def __init__(self, cluster, shard: str = "none"):
        self.cluster = cluster
        self.shard = shard

    def wrap_optimizer(self, optimizer):
        if self.shard == "none":
            return optimizer
        import tensorflow as tf

        from tfdist import allreduce_optimizer
        from tfdist.zero.mwms import ReplicaGather
        from tfdist.zero.optimizer import shard
        from tfdist.zero.scatter import LauncherScatter, ReplicaScatter

        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        if replicas != self.cluster.num_workers:
            raise ConfigError(
                f"--shard {self.shard} under multi_worker splits the state by worker and "
                f"needs one replica per worker. Received: {replicas} replicas on "
                f"{self.cluster.num_workers} workers. Run one device per worker.")
        if self.shard == "parameters":
            from tfdist.zero import split_optimizer

            sharded = split_optimizer.optimizer(optimizer, LauncherScatter(),
                                                self.cluster.worker_index,
                                                self.cluster.num_workers)
        else:
            gradients = self.shard == "gradients"
            sharded = shard(optimizer, ReplicaGather(), self.cluster.worker_index,
                            self.cluster.num_workers, None if gradients else ReplicaScatter(),
                            level=self.shard, engine=LauncherScatter() if gradients else None)
        return allreduce_optimizer.loss_scale_if_float16(sharded, _all_true)

    def split_model(self, model) -> None:
        if self.shard == "parameters":
            import tensorflow as tf

            from tfdist.zero import parameters
            from tfdist.zero.scatter import LauncherScatter

            # MultiWorkerMirrored made every worker's initial values worker 0's.
            parameters.shard_model(model, LauncherScatter(), self.cluster.worker_index,
                                   self.cluster.num_workers,
                                   self.collectives(tf.distribute.get_strategy()),
                                   broadcast=False)


def _all_true(flag):
    """True on every worker when the scalar boolean `flag` is True on all."""
    import tensorflow as tf

    from tfdist.compat import tf_all_to_all

    false = tf.cast(tf.logical_not(tf.cast(flag, tf.bool)), tf.float32)
    return tf.equal(tf_all_to_all.all_reduce_sum(false), 0.0)


@register
class MultiWorker(Adapter):
    """One replica group across processes (MultiWorkerMirroredStrategy)."""

    name = "multi_worker"
    portable = True
    accepts = ("collective", "collective_timeout_s", "startup_timeout_s", "grad_compression",
               "bucket_mb", "shard", "shard_optimizer_state")
    sync_workers = True

    @classmethod
    def check_config(cls, settings, cluster):
        super().check_config(settings, cluster)
        buckets.resolve(settings.adapter.bucket_mb, "multi_worker")  # a bad size, refused
        from tfdist.zero import partition

        partition.check_config(settings)
        check_own_port(cluster)  # a busy port, before TensorFlow starts

    def startup_note(self):
        if not self.cluster.is_multi_worker:
            return super().startup_note()
        return (f"{self.cluster.task_type} {self.cluster.task_index}: starting; waiting up to "
                f"{self.options.startup_timeout_s:g} s (--startup-timeout-s) for the other "
                "workers")

    def build(self):
        return build(self.cluster, self.options)

    def hooks(self) -> Hooks:
        from tfdist.zero import partition

        return MultiWorkerHooks(self.cluster, partition.level(self.options))
