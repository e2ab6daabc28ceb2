"""Host collectives over the shared-memory engine's `Communicator` (`tfdist.shm`)."""

from __future__ import annotations

import numpy as np

from tfdist.collectives import HostCollectives
from tfdist.errors import PeerLostError


class ShmCollectives(HostCollectives):
    """`HostCollectives` through this process's shm communicator.

    Args:
        comm: A `tfdist.shm.comm.Communicator`; the process's one
            (`tfdist.shm.runtime.communicator()`) when None, looked up at each
            call, so this may be built before `tfdist.shm.init`.
    """

    def __init__(self, comm=None):
        self._comm = comm

    @property
    def comm(self):
        if self._comm is not None:
            return self._comm
        from tfdist.shm import runtime

        return runtime.communicator()

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def size(self) -> int:
        return self.comm.size

    def broadcast(self, arrays, root: int = 0) -> list:
        return self.comm.broadcast([np.asarray(a) for a in arrays], root)

    def average(self, arrays) -> list:
        return self.comm.allreduce([np.asarray(a) for a in arrays], average=True)

    def barrier(self) -> None:
        self.comm.barrier()

    def lost_peer(self, error: BaseException) -> PeerLostError | None:
        # Raised inside a tf.numpy_function (the gradient all-reduce), the
        # engine's PeerLostError reaches the trainer as TensorFlow's text only:
        # the communicator kept the structured one.
        return super().lost_peer(error) or self.comm.lost
