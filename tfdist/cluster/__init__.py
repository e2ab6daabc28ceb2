"""Cluster discovery: where this process sits in the job.

Environments are tried in this order, the first that detects itself wins:

1. ``tf_config``: TF_CONFIG is set (an explicit cluster always wins).
2. ``horovod``: a rank started by `horovodrun` (HOROVOD_RANK/SIZE) or by
   OpenMPI's `mpirun` (OMPI_COMM_WORLD_RANK/SIZE). Before Slurm, because a
   Horovod job inside a Slurm allocation is described by its launcher.
3. ``slurm``: running as a task of a Slurm job step (`srun`).
4. ``local``: one process on this machine.

Environment variables are read only in the environment classes (and
`console.py`, for how this process's output should look).
"""

from __future__ import annotations

import os
from typing import Mapping

from tfdist.cluster.base import ClusterEnvironment, ClusterInfo
from tfdist.cluster.console import Console, detect_console
from tfdist.cluster.horovod import HorovodEnvironment
from tfdist.cluster.local import LocalEnvironment
from tfdist.cluster.slurm import SlurmEnvironment
from tfdist.cluster.tf_config import TFConfigEnvironment
from tfdist.errors import ClusterError

ENVIRONMENTS: tuple[type[ClusterEnvironment], ...] = (
    TFConfigEnvironment, HorovodEnvironment, SlurmEnvironment, LocalEnvironment)
_BY_NAME = {env.name: env for env in ENVIRONMENTS}


def detect(environ: Mapping[str, str] | None = None, source: str = "auto") -> ClusterInfo:
    """Discovers the cluster this process belongs to.

    Args:
        environ: Environment to read; defaults to `os.environ`.
        source: "auto" to try every environment in order, or one of
            "tf_config", "horovod", "slurm", "local" to force it.

    Returns:
        The ClusterInfo of this process.

    Raises:
        ClusterError: if the environment is inconsistent, or the forced
            source is not present.
    """
    environ = os.environ if environ is None else environ
    if source != "auto":
        if source not in _BY_NAME:
            raise ClusterError(f"Unknown cluster source {source!r}; valid: "
                               f"{['auto', *_BY_NAME]}.")
        env = _BY_NAME[source]
        if not env.detect(environ):
            raise ClusterError(f"Cluster source {source!r} was requested but its "
                               "environment variables are not set.")
        return env.resolve(environ)
    for env in ENVIRONMENTS:
        if env.detect(environ):
            return env.resolve(environ)
    raise AssertionError("LocalEnvironment always detects")  # pragma: no cover


# Variables a bug report should show: they decide where a process thinks it is.
REPORTED_PREFIXES = ("TF_CONFIG", "TF_CPP_", "TFDIST_", "SLURM_JOB_ID", "SLURM_NTASKS",
                     "SLURM_PROCID", "SLURM_STEP_NODELIST", "HOROVOD_RANK", "HOROVOD_SIZE",
                     "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "CUDA_VISIBLE_DEVICES")


def reported_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The cluster-related variables that are set, for `python -m tfdist.env`."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in sorted(environ) if k.startswith(REPORTED_PREFIXES)}


DEVICES_VAR = "TFDIST_DEVICES"


def local_devices_requested(environ: Mapping[str, str] | None = None) -> int:
    """TFDIST_DEVICES: the logical devices to split this machine's CPU into (0: unset).

    What `--devices N` is to `tfdist.train`, for `keras.distribution.list_devices()`
    (JAX's `--xla_force_host_platform_device_count`).

    Raises:
        ConfigError: for a value that is not a whole number >= 1.
    """
    from tfdist.errors import ConfigError

    raw = (os.environ if environ is None else environ).get(DEVICES_VAR, "").strip()
    if not raw:
        return 0
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{DEVICES_VAR} must be a whole number >= 1 (the CPU split into that "
                          f"many logical devices). Received: {DEVICES_VAR}={raw!r}.")
    return int(raw)


def horovod_venv(environ: Mapping[str, str] | None = None) -> str:
    """The Horovod venv path scripts/install_horovod.sh uses (it may not exist)."""
    from tfdist.cluster.horovod import venv_path

    return venv_path(os.environ if environ is None else environ)


__all__ = ["ClusterInfo", "ClusterEnvironment", "Console", "detect", "detect_console",
           "horovod_venv", "local_devices_requested", "reported_environment",
           "ENVIRONMENTS"]
