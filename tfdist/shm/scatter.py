"""Each rank receives the averaged gradients of the variables it owns (`--shard gradients`).

The shared-memory engine's collectives for `tfdist.zero.scatter.owned_sums`:
a reduce-scatter through the segment (`Communicator.reduce_scatter`: each
rank writes the pieces its peers own, read in place, and sums its own, half
an all-reduce's traffic), averaged, as each rank's loss is its own batch's
mean. The engine's all-reduce makes sparse gradients dense, so they are
scattered as dense ones here too.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ShmScatter:
    """Hashable: a sharded optimizer's class attribute."""

    densify_sparse = True  # its all-reduce makes them dense too: no sparse() needed

    def parts(self, pieces, rank: int, name: str):
        """This rank's piece of `pieces` (flat, one per rank or None) averaged over the
        ranks, each read in place."""
        from tfdist.shm import ops

        return ops.reduce_scatter(pieces, rank, average=True)

    def all_gather(self, part, name: str):
        """Every rank's flat `part` (one size everywhere), concatenated in rank order."""
        from tfdist.shm import ops

        return ops.all_gather(part)

    def reduce_rows(self, flat, rank: int, n: int, name: str):
        """This rank's n-th of the flat `flat` (n equal parts) averaged over the ranks."""
        import tensorflow as tf

        from tfdist.shm import ops

        return ops.reduce_scatter(tf.split(flat, n), rank, average=True)

    def all_sum(self, x):
        """The scalar `x` summed over the ranks."""
        from tfdist.shm import ops

        (total,) = ops.allreduce([x], average=False)
        return total
