"""TF_CONFIG: the cluster spec TensorFlow itself reads.

Format (https://www.tensorflow.org/guide/distributed_training#TF_CONFIG)::

    {"cluster": {"chief": ["h0:2222"], "worker": ["h1:2222", "h2:2222"]},
     "task": {"type": "worker", "index": 0}}

Numbering: when a "chief" task exists it is worker 0 and "worker" i is worker
i + 1; without one, "worker" 0 is the chief. This matches what
MultiWorkerMirroredStrategy does, so `worker_index` is the replica group's rank.
"""

from __future__ import annotations

import json
from typing import Any

from tfdist.cluster.base import ClusterEnvironment, ClusterInfo
from tfdist.errors import ClusterError

ENV_VAR = "TF_CONFIG"
KNOWN_TASK_TYPES = ("chief", "worker", "ps", "evaluator")
_HINT = ("HINT: TF_CONFIG must be JSON like "
         '{"cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}, '
         '"task": {"type": "worker", "index": 0}}; '
         "unset it to train on this machine alone.")


def _fail(message: str) -> ClusterError:
    return ClusterError(f"Invalid TF_CONFIG: {message}\n{_HINT}")


def _check_address(field: str, address: Any) -> None:
    if not isinstance(address, str) or address.count(":") < 1:
        raise _fail(f"{field} must be a 'host:port' string. Received: {address!r}.")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise _fail(f"{field} must be a 'host:port' string with a port in 1-65535. "
                    f"Received: {address!r}.")


def parse_tf_config(text: str) -> dict[str, Any]:
    """Parses and validates a TF_CONFIG string.

    Args:
        text: The raw value of the TF_CONFIG environment variable.

    Returns:
        The decoded dict, unchanged.

    Raises:
        ClusterError: naming the field and the value received.
    """
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise _fail(f"not valid JSON ({e.msg} at position {e.pos}). "
                    f"Received: {text[:200]!r}.") from None
    if not isinstance(config, dict):
        raise _fail(f"top level must be an object. Received: {type(config).__name__}.")
    for key in ("cluster", "task"):
        if key not in config:
            raise _fail(f"missing field '{key}'. Received keys: {sorted(config)}.")
    cluster, task = config["cluster"], config["task"]
    if not isinstance(cluster, dict) or not cluster:
        raise _fail(f"field 'cluster' must be a non-empty object. Received: {cluster!r}.")
    seen: dict[str, str] = {}
    for task_type, addresses in cluster.items():
        if task_type not in KNOWN_TASK_TYPES:
            raise _fail(f"cluster has unknown task type {task_type!r}; "
                        f"known: {list(KNOWN_TASK_TYPES)}.")
        if not isinstance(addresses, list) or not addresses:
            raise _fail(f"cluster.{task_type} must be a non-empty list of addresses. "
                        f"Received: {addresses!r}.")
        for i, address in enumerate(addresses):
            field = f"cluster.{task_type}[{i}]"
            _check_address(field, address)
            if address in seen:
                raise _fail(f"duplicate address {address!r} in {seen[address]} and {field}.")
            seen[address] = field
    if len(cluster.get("chief", [])) > 1:
        raise _fail(f"cluster.chief must list exactly one address. "
                    f"Received: {cluster['chief']!r}.")
    if not isinstance(task, dict):
        raise _fail(f"field 'task' must be an object. Received: {task!r}.")
    task_type = task.get("type")
    if task_type not in cluster:
        raise _fail(f"task.type {task_type!r} is not a task type in cluster "
                    f"{sorted(cluster)}.")
    index = task.get("index", 0)
    if isinstance(index, bool) or not isinstance(index, int):
        raise _fail(f"task.index must be an integer. Received: {index!r}.")
    if not 0 <= index < len(cluster[task_type]):
        raise _fail(f"task.index {index} is out of range for cluster.{task_type}, which "
                    f"has {len(cluster[task_type])} address(es).")
    return config


def info_from_tf_config(config: dict[str, Any], source: str = "tf_config") -> ClusterInfo:
    """Builds ClusterInfo from a validated TF_CONFIG dict."""
    cluster, task = config["cluster"], config["task"]
    task_type, task_index = task["type"], task.get("index", 0)
    num_chief = len(cluster.get("chief", []))
    num_workers = num_chief + len(cluster.get("worker", []))
    if task_type == "chief":
        worker_index = 0
    elif task_type == "worker":
        worker_index = num_chief + task_index
    else:
        # ps and evaluator tasks are not in the synchronous replica group.
        worker_index = -1
    address = cluster[task_type][task_index]
    return ClusterInfo(source=source, num_workers=num_workers, worker_index=worker_index,
                       task_type=task_type, task_index=task_index, tf_config=config,
                       hostname=address.rpartition(":")[0])


class TFConfigEnvironment(ClusterEnvironment):
    """A cluster described by the TF_CONFIG environment variable."""

    name = "tf_config"

    @staticmethod
    def detect(environ) -> bool:
        return bool(environ.get(ENV_VAR, "").strip())

    @staticmethod
    def resolve(environ) -> ClusterInfo:
        return info_from_tf_config(parse_tf_config(environ[ENV_VAR]))
