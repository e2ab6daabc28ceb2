"""Host collectives: one interface for the engines that run one replica per process.

Horovod and the shared-memory engine (and MultiWorkerMirrored, where a
process-level decision is needed, e.g. the preemption agreement) each move
host values between the processes of a job; what tfdist builds on top of
them (the initial-state broadcast, the epoch-metric average, the "did any
rank get SIGTERM" agreement) is written once, against `HostCollectives`
(`tfdist.collectives.keras_callbacks`), as Horovod's `_keras` package is
one implementation under thin per-framework wrappers.

Engines: `shm.ShmCollectives`, `horovod.HorovodCollectives`,
`mwms.MWMSCollectives`; `Local` for a single process. `for_strategy` picks
the one a TensorFlow strategy needs when no engine of tfdist's runs.

Every call is collective: every process makes the same calls in the same
order with the same shapes and dtypes.
"""

from __future__ import annotations

import numpy as np

from tfdist.errors import PeerLostError


class HostCollectives:
    """Collectives on numpy values between the `size` processes of a job.

    Attributes:
        rank: This process's rank, 0..size-1.
        size: Number of processes.
    """

    rank: int = 0
    size: int = 1

    def broadcast(self, arrays, root: int = 0) -> list:
        """Every process gets `root`'s arrays (the same shapes and dtypes on every process)."""
        raise NotImplementedError

    def average(self, arrays) -> list:
        """The element-wise mean of each floating array across processes."""
        raise NotImplementedError

    def barrier(self) -> None:
        """Returns once every process has called it."""
        self.average([np.zeros(1)])

    def any_true(self, flag: bool) -> bool:
        """True on every process when `flag` is True on any of them."""
        (mean,) = self.average([np.array([1.0 if flag else 0.0])])
        return bool(mean[0] > 0.0)

    def all_true(self, flag: bool) -> bool:
        """True on every process when `flag` is True on all of them."""
        (mean,) = self.average([np.array([1.0 if flag else 0.0])])
        return bool(mean[0] > 1.0 - 0.5 / self.size)

    def lost_peer(self, error: BaseException) -> PeerLostError | None:
        """The peer whose loss `error` reports, as fields (rank, address), if the engine knows.

        Args:
            error: What a collective (or a training step running one) raised.
        """
        return error if isinstance(error, PeerLostError) and error.rank is not None else None


class Local(HostCollectives):
    """One process: every collective is the identity."""

    def broadcast(self, arrays, root: int = 0) -> list:
        return [np.array(a, copy=True) for a in arrays]

    def average(self, arrays) -> list:
        return [np.array(a, copy=True) for a in arrays]

    def barrier(self) -> None:
        return None


def for_strategy(strategy) -> HostCollectives:
    """The host collectives a TensorFlow strategy's processes share.

    MultiWorkerMirrored over several tasks: `MWMSCollectives`; any other
    strategy runs in one process here: `Local`. (Horovod and shm runs get
    their engine's collectives from their hooks.)
    """
    import tensorflow as tf

    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        from tfdist.collectives.mwms import MWMSCollectives

        collectives = MWMSCollectives(strategy)
        if collectives.size > 1:
            return collectives
    return Local()


__all__ = ["HostCollectives", "Local", "for_strategy"]
