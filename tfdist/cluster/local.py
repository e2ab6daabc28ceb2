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


# Device nodes a GPU TensorFlow can use needs: NVIDIA's driver makes /dev/nvidia0..N,
# ROCm /dev/kfd, WSL2's GPU paravirtualisation /dev/dxg.
_GPU_DEVICE_NODES = ("nvidia", "kfd", "dxg")


def gpus_possible(environ, dev_entries, platform: str) -> bool:
    """Pure function: False only when TensorFlow cannot see a GPU here, told without TensorFlow.

    `--strategy auto` becomes `single` or `mirrored` by the GPUs TensorFlow
    counts, and the default model dir is named before TensorFlow starts (a
    finished run exits without starting it). Where no GPU can exist the name
    is known anyway: CUDA_VISIBLE_DEVICES empty or -1 hides every GPU, and on
    Linux a GPU needs a device node in /dev. Elsewhere (macOS has Metal
    plugins) a GPU stays possible.

    Args:
        environ: The environment.
        dev_entries: The names in /dev.
        platform: `sys.platform`.
    """
    if environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return False
    if not platform.startswith("linux"):
        return True
    return any(name.startswith(_GPU_DEVICE_NODES) for name in dev_entries)
