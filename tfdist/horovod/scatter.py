"""Each rank receives the averaged gradients of the variables it owns, over Horovod
(`--shard gradients`).

Horovod's collectives for `tfdist.zero.scatter.owned_sums`: `hvd.reducescatter`
of an [n, width] piece gives rank r row r, averaged (each rank's loss is its
own batch's mean); sparse gradients are
gathered whole (`tfdist.horovod.optimizer.sparse_allreduce`), as without
sharding. Collectives pair across ranks by name, so each is named from its
place in the step (the same sequence on every rank), and every result is
read by a stateful op (`keep`): Horovod's ops are not stateful, and a
result this rank does not use would be pruned while its peers wait.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class HorovodScatter:
    """Hashable: a sharded optimizer's class attribute."""

    densify_sparse = False

    def rows(self, sent, name: str):
        """This rank's row of `sent` ([n, width]) averaged over the ranks."""
        from tfdist.horovod import runtime

        hvd = runtime.hvd()
        return hvd.reducescatter(sent, op=hvd.Average, name=name, ignore_name_scope=True)[0]

    def all_gather(self, part, name: str):
        """Every rank's flat `part` (one size everywhere), concatenated in rank order."""
        from tfdist.horovod import runtime

        return runtime.hvd().allgather(part, name=name, ignore_name_scope=True)

    def reduce_rows(self, flat, rank: int, n: int, name: str):
        """This rank's n-th of the flat `flat` (n equal parts) averaged over the ranks."""
        import tensorflow as tf

        from tfdist.horovod import runtime

        hvd = runtime.hvd()
        return hvd.reducescatter(tf.reshape(flat, [n, -1]), op=hvd.Average, name=name,
                                 ignore_name_scope=True)[0]

    def sparse(self, grads: list) -> list:
        """IndexedSlices averaged over the ranks (their slices gathered)."""
        from tfdist.horovod import runtime
        from tfdist.horovod.optimizer import sparse_allreduce

        hvd = runtime.hvd()
        return [sparse_allreduce(hvd, g, f"tfdist_zero_sparse_{i}", average=True)
                for i, g in enumerate(grads)]

    def all_sum(self, x):
        """The scalar `x` summed over the ranks."""
        from tfdist.horovod import runtime

        hvd = runtime.hvd()
        return hvd.allreduce(x, op=hvd.Sum, name="tfdist_zero_clip_norm",
                             ignore_name_scope=True)

    def keep(self, tensors):
        """A stateful op reading `tensors`, so none is pruned (`tfdist.horovod.gather`)."""
        from tfdist.horovod.gather import _keep

        return _keep(tensors)
