"""Every rank gets each variable's value from the rank that owns it (`--shard-optimizer-state`).

One broadcast per owner (its variables, small ones fused into one flat
tensor), the owners in rank order, each after the previous one's variables
were assigned: at most one fused bucket of received values is alive at a
time. Each rank reads the S(n-1)/n bytes it does not own and its owner
writes S/n: the all-gather half of an all-reduce.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfdist.shm import runtime
from tfdist.shm.comm import fusion_buckets


@dataclasses.dataclass(frozen=True)
class OwnerGather:
    """Sets every variable to its owner's value (hashable: a sharded optimizer's class attribute)."""

    def __call__(self, variables, owners, rank):
        comm = runtime.communicator()
        if comm.size == 1:
            return
        previous = []
        for root in range(comm.size):
            index = [i for i, o in enumerate(owners) if o == root]
            sizes = [(variables[i].dtype, _nbytes(variables[i])) for i in index]
            for bucket in fusion_buckets(sizes, comm.fusion_threshold_bytes):
                previous = _broadcast(comm, [variables[index[j]] for j in bucket], root, rank,
                                      previous)


def _nbytes(variable) -> int:
    from tfdist.zero.optimizer import variable_bytes

    return variable_bytes(variable)


def _broadcast(comm, variables, root: int, rank: int, after):
    """One numpy_function broadcasting `variables` (fused) from `root`, after the ops in
    `after`; returns the ops the next broadcast waits for (the assigns, on a receiver)."""
    import tensorflow as tf

    dtype = tf.as_dtype(variables[0].dtype)
    sizes = [v.shape.num_elements() for v in variables]
    with tf.control_dependencies(list(after)):
        if rank == root:
            flat = tf.concat([tf.reshape(v.value, [-1]) for v in variables], 0) \
                if len(variables) > 1 else tf.reshape(variables[0].value, [-1])

            def send(x):
                comm.broadcast([x], root, out=[x])
                return np.int8(0)

            done = tf.numpy_function(send, [flat], tf.int8, stateful=True,
                                     name="tfdist_shm_owner_send")
            return [done]
        buffer = tf.raw_ops.Empty(shape=[sum(sizes)], dtype=dtype)

        def receive(out):
            target = out if out.flags.writeable and out.flags.c_contiguous else None
            (got,) = comm.broadcast([out], root, out=None if target is None else [target])
            return got

        received = tf.numpy_function(receive, [buffer], dtype, stateful=True,
                                     name="tfdist_shm_owner_receive")
        received.set_shape([sum(sizes)])
    parts = tf.split(received, sizes) if len(variables) > 1 else [received]
    return [v.value.assign(tf.reshape(p, v.shape), read_value=False)
            for v, p in zip(variables, parts)]

