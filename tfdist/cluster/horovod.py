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

from tfdist.cluster.base import ClusterEnvironment, ClusterInfo
from tfdist.errors import ClusterError

# (rank, size, local rank) variable names, tried in order.
FAMILIES = (
    ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
)


def _family(environ):
    for names in FAMILIES:
        if names[0] in environ and names[1] in environ:
            return names
    return None


def _int(environ, name: str, default: int | None = None) -> int:
    value = environ.get(name)
    if value is None and default is not None:
        return default
    if value is None or not value.strip().isdigit():
        raise ClusterError(f"{name} must be a non-negative integer. Received: {value!r}.\n"
                           "HINT: start Horovod ranks with `horovodrun`, which sets it.")
    return int(value)


class HorovodEnvironment(ClusterEnvironment):
    """A rank started by `horovodrun` (Gloo) or by OpenMPI's `mpirun`."""

    name = "horovod"

    @staticmethod
    def detect(environ) -> bool:
        return _family(environ) is not None

    @staticmethod
    def resolve(environ) -> ClusterInfo:
        rank_var, size_var, local_var = _family(environ)
        rank, size = _int(environ, rank_var), _int(environ, size_var)
        if size < 1 or not 0 <= rank < size:
            raise ClusterError(f"{rank_var}={rank} is out of range for {size_var}={size}.\n"
                               "HINT: start Horovod ranks with `horovodrun -np N ...`.")
        local_rank = _int(environ, local_var, default=0)
        return ClusterInfo(source="horovod", num_workers=size, worker_index=rank,
                           task_type="worker", task_index=rank, tf_config=None,
                           local_rank=local_rank, hostname=environ.get("HOROVOD_HOSTNAME"))


VENV_VAR = "TFDIST_HOROVOD_VENV"


def venv_path(environ, home: str | None = None) -> str:
    """The Horovod venv that scripts/install_horovod.sh makes: $TFDIST_HOROVOD_VENV or
    ~/.cache/tfdist/horovod-venv (whether or not it exists)."""
    import os

    home = home or os.path.expanduser("~")
    return environ.get(VENV_VAR) or os.path.join(home, ".cache", "tfdist", "horovod-venv")
