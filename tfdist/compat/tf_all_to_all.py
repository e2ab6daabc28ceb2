"""MultiWorkerMirroredStrategy offers no reduce-scatter on CPU: an all-to-all stands in.

Upstream: TensorFlow 2.21's `CollectiveReduceScatterV2` has a CPU op kernel
but only an NCCL collective implementation: on 2 CPU workers it fails with
"CollectiveRegistry::Lookup did not find collective implementation undef". And
`tf.distribute.ReplicaContext` offers `all_reduce` and `all_gather` but no
reduce-scatter or all-to-all. `CollectiveAllToAllV2` does run on CPU over
gRPC: rank q receives row q of every rank's input (checked on 2 and 4
MultiWorkerMirrored workers), so summing what arrives is a reduce-scatter
(`tfdist.zero.scatter`).

These ops are issued through the strategy's own per-replica launcher (the
private `extended._cross_device_ops._launchers`): it hands out the strategy's
group key, the next instance key (at call time, as for its own collectives)
and its ordering token, so they are ordered with the strategy's all-reduces
and all_gathers on every worker alike. That works in replica and in
cross-replica context (one replica per worker).
"""

from __future__ import annotations

UPSTREAM = ("TensorFlow 2.21: CollectiveReduceScatterV2 has only an NCCL implementation, and "
            "ReplicaContext has no all_to_all")


class TFCollectiveInternalsChanged(RuntimeError):
    """The strategy's collective launcher this workaround uses moved."""


def _launcher():
    """The strategy's launcher of this worker's one replica."""
    import tensorflow as tf

    cross_device_ops = getattr(tf.distribute.get_strategy().extended, "_cross_device_ops", None)
    launchers = getattr(cross_device_ops, "_launchers", None)
    if not launchers or len(launchers) != 1 or not all(
            hasattr(launchers[0], a) for a in ("_group_key", "_group_size", "_next_instance_key",
                                               "_get_ordering_token", "_device", "_options")):
        raise TFCollectiveInternalsChanged(
            f"tfdist cannot issue an all-to-all through {tf.__version__}'s "
            "MultiWorkerMirroredStrategy (one replica per worker, a CollectiveReplicaLauncher "
            "expected). HINT: drop --shard-optimizer-state, or update "
            "tfdist/compat/tf_all_to_all.py.")
    return launchers[0]


def all_to_all(x):
    """Row q of `x` (shape [workers, ...]) goes to rank q; returns [workers, ...], row p
    from rank p."""
    import tensorflow as tf
    from tensorflow.python.ops import collective_ops

    launcher = _launcher()
    with tf.device(launcher._device):
        return collective_ops.all_to_all_v2(
            x, launcher._group_size, launcher._group_key, launcher._next_instance_key(),
            communication_hint=launcher._options.implementation.value,
            timeout=launcher._options.timeout_seconds or 0,
            ordering_token=launcher._get_ordering_token())


def all_gather(x):
    """Every worker's `x` (one shape everywhere) concatenated on axis 0, in worker order,
    in replica or cross-replica context (inside a tf.function)."""
    return _launcher().all_gather(x, axis=0)


def all_reduce_sum(x):
    """The sum of `x` over the workers, in replica or cross-replica context."""
    return _launcher().all_reduce(x)


def all_reduce_indexed_slices(slices):
    """IndexedSlices summed over the workers (their slices gathered), in either context."""
    return _launcher().all_reduce_indexed_slices(slices)
