"""The process's one shared-memory `Communicator`, and building it from the cluster."""

from __future__ import annotations

import atexit
import socket

from tfdist.errors import ClusterError
from tfdist.shm.comm import DEFAULT_CHUNK_BYTES, DEFAULT_FUSION_BYTES, Communicator

_COMM: Communicator | None = None


def init(rank: int, size: int, address: tuple[str, int], *,
         chunk_bytes: int = DEFAULT_CHUNK_BYTES, timeout_s: float = 300.0,
         fusion_threshold_bytes: int = DEFAULT_FUSION_BYTES) -> Communicator:
    """Creates this process's communicator (collective: every rank calls it).

    Args:
        rank: This process's rank.
        size: Number of processes.
        address: (host, port) where rank 0 listens for the rendezvous.
        chunk_bytes: Per-rank chunk of each block (see `Communicator`).
        timeout_s: How long to wait for a peer before PeerLostError.
        fusion_threshold_bytes: Tensors smaller than this are all-reduced
            together in buckets of up to this size (0: no fusion).

    Raises:
        RuntimeError: when this process already has one.
    """
    global _COMM
    if _COMM is not None:
        raise RuntimeError("tfdist.shm is already initialised in this process; call "
                           "tfdist.shm.shutdown() first.")
    _COMM = Communicator(rank, size, address, chunk_bytes=chunk_bytes, timeout_s=timeout_s,
                         fusion_threshold_bytes=fusion_threshold_bytes)
    atexit.register(shutdown)
    return _COMM


def is_initialized() -> bool:
    """True once `init` has run in this process (and `shutdown` has not)."""
    return _COMM is not None


def communicator() -> Communicator:
    """The communicator `init` created.

    Raises:
        RuntimeError: before `init`.
    """
    if _COMM is None:
        raise RuntimeError("tfdist.shm is not initialised: call tfdist.shm.init(rank, size, "
                           "address) first, or train with --strategy shm.")
    return _COMM


def shutdown() -> None:
    """Closes the communicator, if any."""
    global _COMM
    if _COMM is not None:
        _COMM.close()
        _COMM = None


def _local_addresses() -> set[str]:
    names = {"localhost", socket.gethostname(), socket.getfqdn()}
    out = set(names)
    for name in names:
        try:
            out.update(info[4][0] for info in socket.getaddrinfo(name, None))
        except OSError:
            pass
    return out


def is_local_host(host: str, local: set[str] | None = None) -> bool:
    """True when `host` names this machine (a loopback address or one of its names).

    Args:
        host: A host name or address.
        local: This machine's names and addresses, when the caller already
            looked them up (they cost DNS queries).
    """
    if host.startswith("127.") or host in ("::1", "[::1]"):
        return True
    local = _local_addresses() if local is None else local
    if host in local:
        return True
    try:
        return any(info[4][0] in local or info[4][0].startswith("127.")
                   for info in socket.getaddrinfo(host, None))
    except OSError:
        return False


def rendezvous_address(cluster) -> tuple[str, int]:
    """Pure-ish: (host, port) of worker 0 from the cluster's TF_CONFIG.

    Raises:
        ClusterError: when the workers are not all on this host.
    """
    addresses = cluster.worker_addresses
    if len(addresses) != cluster.num_workers:
        raise ClusterError(f"--strategy shm: the cluster lists {len(addresses)} worker "
                           f"addresses for {cluster.num_workers} workers.\n"
                           "HINT: start it with tfdist.launch -n N or under srun.")
    local = _local_addresses()
    remote = [a for a in addresses if not is_local_host(a.rpartition(":")[0], local)]
    if remote:
        raise ClusterError(
            f"--strategy shm trains processes on one host through shared memory, but workers "
            f"{remote} are on other hosts.\nHINT: use --strategy multi_worker or horovod "
            "across hosts.")
    host, _, port = addresses[0].rpartition(":")
    return host.strip("[]"), int(port)


def init_from_cluster(cluster, timeout_s: float | None = 300.0,
                      chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                      fusion_threshold_bytes: int = DEFAULT_FUSION_BYTES) -> Communicator:
    """`init` with rank, size and address from a `tfdist.cluster.ClusterInfo`.

    Rank 0 listens on worker 0's address from TF_CONFIG; that port is free
    because this engine starts no TensorFlow server.
    """
    if cluster.num_workers == 1:
        return init(0, 1, ("127.0.0.1", 0), timeout_s=timeout_s or 300.0)
    return init(cluster.worker_index, cluster.num_workers, rendezvous_address(cluster),
                chunk_bytes=chunk_bytes, timeout_s=timeout_s or 300.0,
                fusion_threshold_bytes=fusion_threshold_bytes)
