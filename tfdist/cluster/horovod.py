"""Horovod: rank, size and local rank from the variables `horovodrun` sets.

`horovodrun --gloo` (and `horovodrun` on Spark/Ray) sets HOROVOD_RANK,
HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE and HOROVOD_HOSTNAME for
every rank. `horovodrun --mpi` starts ranks with OpenMPI's `mpirun`, which
sets OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE and OMPI_COMM_WORLD_LOCAL_RANK
instead. Either family describes the same thing; horovod's own `hvd.rank()`
agrees with it once `hvd.init()` has run.

No TF_CONFIG is produced: Horovod's collectives need no TensorFlow cluster.
"""

from __future__ import annotations

from tfdist.cluster.base import ClusterEnvironment, ClusterInfo, env_count
from tfdist.errors import ClusterError

# (rank, size, local rank) variable names of each launcher.
FAMILIES = (
    ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
)
_HINT = "start Horovod ranks with `horovodrun -np N ...` (or `mpirun`), which sets them."


def _family(environ):
    """The one complete (rank, size) family; ClusterError for a partial or conflicting set."""
    complete = [f for f in FAMILIES if f[0] in environ and f[1] in environ]
    partial = [name for f in FAMILIES if f not in complete for name in f[:2] if name in environ]
    if partial:
        have = {n: environ[n][:40] for f in FAMILIES for n in f[:2] if n in environ}
        raise ClusterError(
            f"Horovod/MPI rank variables are incomplete or mixed: {have}. A rank needs both "
            "its rank and size from one launcher (HOROVOD_RANK with HOROVOD_SIZE, or "
            f"OMPI_COMM_WORLD_RANK with OMPI_COMM_WORLD_SIZE).\nHINT: {_HINT} Unset stray "
            "ones left from another launcher.")
    return complete


class HorovodEnvironment(ClusterEnvironment):
    """A rank started by `horovodrun` (Gloo) or by OpenMPI's `mpirun`."""

    name = "horovod"

    @staticmethod
    def detect(environ) -> bool:
        # Any rank variable claims the process, so that an incomplete set is an error,
        # not a lone chief (a size alone says nothing about this process).
        return any(f[0] in environ for f in FAMILIES)

    @staticmethod
    def resolve(environ) -> ClusterInfo:
        families = _family(environ)
        if not families:
            raise ClusterError(f"No Horovod/MPI rank variables are set.\nHINT: {_HINT}")
        ranks = []
        for rank_var, size_var, local_var in families:
            size = env_count(environ, size_var, _HINT)
            rank = env_count(environ, rank_var, _HINT)
            if size < 1 or not 0 <= rank < size:
                raise ClusterError(f"{rank_var}={rank} is out of range for {size_var}={size}."
                                   f"\nHINT: {_HINT}")
            local_rank = env_count(environ, local_var, _HINT, default=0)
            if local_rank >= size:
                raise ClusterError(f"{local_var}={local_rank} is out of range for "
                                   f"{size_var}={size}.\nHINT: {_HINT}")
            ranks.append((rank, size, local_rank))
        if len(set(ranks)) > 1:
            (a, b) = families
            raise ClusterError(
                f"Horovod and MPI variables disagree: {a[0]}/{a[1]}={ranks[0][0]}/{ranks[0][1]} "
                f"but {b[0]}/{b[1]}={ranks[1][0]}/{ranks[1][1]}.\nHINT: {_HINT} Unset the "
                "stray family.")
        rank, size, local_rank = ranks[0]
        launcher = "horovodrun" if families[0][0] == "HOROVOD_RANK" else "mpirun"
        return ClusterInfo(source="horovod", num_workers=size, worker_index=rank,
                           task_type="worker", task_index=rank, tf_config=None,
                           local_rank=local_rank, hostname=environ.get("HOROVOD_HOSTNAME"),
                           launcher=launcher)


VENV_VAR = "TFDIST_HOROVOD_VENV"


def venv_path(environ, home: str | None = None) -> str:
    """The Horovod venv that scripts/install_horovod.sh makes: $TFDIST_HOROVOD_VENV or
    ~/.cache/tfdist/horovod-venv (whether or not it exists)."""
    import os

    home = home or os.path.expanduser("~")
    return environ.get(VENV_VAR) or os.path.join(home, ".cache", "tfdist", "horovod-venv")
