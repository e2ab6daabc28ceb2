"""The local machine: one process, however many devices it has."""

from __future__ import annotations

import socket

from tfdist.cluster.base import ClusterEnvironment, ClusterInfo


class LocalEnvironment(ClusterEnvironment):
    """Fallback when no cluster is described: a single worker, the chief."""

    name = "local"

    @staticmethod
    def detect(environ) -> bool:
        return True

    @staticmethod
    def resolve(environ) -> ClusterInfo:
        return ClusterInfo(source="local", num_workers=1, worker_index=0,
                           hostname=socket.gethostname())
