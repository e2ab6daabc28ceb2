"""The result of cluster discovery, shared by every environment."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Mapping

from tfdist.errors import ClusterError

INT_MAX = 2**31 - 1  # ranks, sizes, ids and counts fit a C int in every launcher
_DIGITS = re.compile(r"[0-9]{1,10}", re.ASCII)  # Python's int() also takes "٣" and "1_0"


def parse_count(name: str, value: str | None, hint: str, maximum: int = INT_MAX) -> int:
    """Pure function: a non-negative decimal integer environment value, or ClusterError.

    Args:
        name: The variable (named in the error).
        value: Its value.
        hint: The HINT line of the error.
        maximum: The largest value accepted.

    Raises:
        ClusterError: naming the variable and the value received, for anything
            but ASCII digits, or a number above `maximum`.
    """
    text = value.strip() if isinstance(value, str) else value
    if not isinstance(text, str) or not _DIGITS.fullmatch(text) or int(text) > maximum:
        shown = repr(value) if value is None or len(value) <= 40 else repr(value[:40]) + "..."
        raise ClusterError(f"{name} must be an integer in 0-{maximum}. Received: "
                           f"{name}={shown}.\nHINT: {hint}")
    return int(text)


def env_count(environ: Mapping[str, str], name: str, hint: str, default: int | None = None,
              maximum: int = INT_MAX) -> int:
    """`parse_count` of `environ[name]`; `default` when unset (ClusterError when required)."""
    if name not in environ and default is not None:
        return default
    return parse_count(name, environ.get(name), hint, maximum)


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """Where this process sits in the job.

    Attributes:
        source: Which environment produced it: "tf_config", "slurm" or "local".
        num_workers: Number of training processes (chief included) that take
            part in synchronous training.
        worker_index: This process's rank among them, 0-based; the chief is 0.
        task_type: TF task type of this process ("chief", "worker", "ps", ...).
        task_index: TF task index within `task_type`.
        tf_config: The TF_CONFIG dict that TensorFlow must see, or None when
            the job is a single process.
        local_rank: Rank of this process on its host (picks a GPU there).
        hostname: Host this process runs on, when the source knows it.
        launcher: The program that started the job's processes, when the
            environment says ("tfdist.launch", "horovodrun", "mpirun", "srun").
        job_workers: The workers the job was started with, when the launcher
            says (`tfdist.launch -n N`: N, also for survivors relaunched by
            --min-workers, which go on with the same run).
    """

    source: str
    num_workers: int
    worker_index: int
    task_type: str = "worker"
    task_index: int = 0
    tf_config: dict[str, Any] | None = None
    local_rank: int = 0
    hostname: str | None = None
    launcher: str | None = None
    job_workers: int | None = None

    @property
    def num_tasks(self) -> int:
        """Every process of the job: the training workers and any ps tasks."""
        spec = (self.tf_config or {}).get("cluster", {})
        return max(self.num_workers, sum(len(v) for v in spec.values()))

    @property
    def training_workers(self) -> int:
        """Processes that compute gradients: a parameter-server job's 'worker' tasks (its
        chief coordinates, its ps tasks hold variables), else every worker."""
        spec = (self.tf_config or {}).get("cluster", {})
        return len(spec.get("worker", [])) if spec.get("ps") else self.num_workers

    @property
    def origin(self) -> str:
        """Where the job's size was read, for messages: 'tfdist.launch (TF_CONFIG)', 'Slurm'..."""
        variable = {"tf_config": "TF_CONFIG", "slurm": "SLURM_NTASKS",
                    "horovod": "HOROVOD_SIZE" if self.launcher == "horovodrun"
                    else "OMPI_COMM_WORLD_SIZE"}.get(self.source)
        where = {"tfdist.launch": "tfdist.launch", "srun": "Slurm", "horovodrun": "horovodrun",
                 "mpirun": "mpirun"}.get(self.launcher or "", "")
        if not variable:
            return where or self.source
        return f"{where} ({variable})" if where else variable

    @property
    def is_chief(self) -> bool:
        """True for the one process that writes checkpoints, logs and models."""
        return self.worker_index == 0 and self.task_type in ("chief", "worker")

    @property
    def is_multi_worker(self) -> bool:
        """True when more than one process trains together."""
        return self.num_workers > 1

    @property
    def worker_addresses(self) -> list[str]:
        """'host:port' of every training worker, indexed by `worker_index`.

        The chief (when TF_CONFIG has one) is worker 0, then the "worker"
        tasks; empty for a job without a TF_CONFIG cluster.
        """
        spec = (self.tf_config or {}).get("cluster", {})
        return [*spec.get("chief", []), *spec.get("worker", [])]

    def tf_config_json(self) -> str | None:
        """TF_CONFIG as the JSON string TensorFlow reads, or None."""
        return None if self.tf_config is None else json.dumps(self.tf_config)


class ClusterEnvironment:
    """One source of cluster information (an env var family, a scheduler).

    Subclasses read their environment variables here and nowhere else; the
    mapping is passed in so that tests can use a cleared environment.
    """

    name = "base"

    @staticmethod
    def detect(environ) -> bool:  # pragma: no cover - interface
        """Returns True when `environ` describes this kind of cluster."""
        raise NotImplementedError

    @staticmethod
    def resolve(environ) -> ClusterInfo:  # pragma: no cover - interface
        """Builds the ClusterInfo, raising ClusterError on inconsistent input."""
        raise NotImplementedError
