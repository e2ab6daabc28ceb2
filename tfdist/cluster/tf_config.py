"""TF_CONFIG: the cluster spec TensorFlow itself reads.

Format (https://www.tensorflow.org/guide/distributed_training#TF_CONFIG)::

    {"cluster": {"chief": ["h0:2222"], "worker": ["h1:2222", "h2:2222"]},
     "task": {"type": "worker", "index": 0}}

Numbering: when a "chief" task exists it is worker 0 and "worker" i is worker
i + 1; without one, "worker" 0 is the chief. This matches what
MultiWorkerMirroredStrategy does, so `worker_index` is the replica group's rank.

The rules are TensorFlow's (`multi_worker_util._validate_cluster_spec`): task
types chief, worker, ps, evaluator; at most one chief and one evaluator;
task.type a string naming a job of the cluster; task.index present and in
range. Where tfdist is deliberately stricter, it says so in the error:

* an `evaluator` *task* is refused (tfdist has no side-car evaluator: the
  chief evaluates after training); an evaluator listed in the cluster is
  allowed and ignored by the training workers;
* task.index must be a JSON integer (TensorFlow also takes "1" and 1.0);
* every job is a non-empty list (TensorFlow also takes {index: address});
* every address is 'host:port' with a port in 1-65535, an IPv6 host in
  brackets ('[::1]:2222'), and no address twice (compared without case or
  leading zeros: "H:02222" is "h:2222");
* TF_CONFIG, when set, must have both "cluster" and "task".
"""

from __future__ import annotations

import dataclasses

import ipaddress
import json
import re
from typing import Any

from tfdist.cluster.base import ClusterEnvironment, ClusterInfo, env_count
from tfdist.errors import ClusterError

ENV_VAR = "TF_CONFIG"
KNOWN_TASK_TYPES = ("chief", "worker", "ps", "evaluator")
_HINT = ("HINT: TF_CONFIG must be JSON like "
         '{"cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}, '
         '"task": {"type": "worker", "index": 0}}; '
         "unset it to train on this machine alone.")


def _fail(message: str) -> ClusterError:
    return ClusterError(f"Invalid TF_CONFIG: {message}\n{_HINT}")


_HOSTNAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252})", re.ASCII)
_PORT = re.compile(r"[0-9]{1,5}", re.ASCII)


def split_address(field: str, address: Any) -> tuple[str, int]:
    """Pure function: ('host', port) of a 'host:port' or '[ipv6]:port' address.

    The host is returned canonical (lower case, IPv6 compressed), so equal
    addresses compare equal.

    Raises:
        ClusterError: naming `field` and the address received.
    """
    if not isinstance(address, str) or ":" not in address:
        raise _fail(f"{field} must be a 'host:port' string. Received: {_short(address)}.")
    host, _, port = address.rpartition(":")
    if not _PORT.fullmatch(port) or not 0 < int(port) < 65536:
        raise _fail(f"{field} must be a 'host:port' string with a port in 1-65535. "
                    f"Received: {_short(address)}.")
    if host.startswith("[") and host.endswith("]"):
        try:
            return str(ipaddress.IPv6Address(host[1:-1])), int(port)
        except ValueError:
            raise _fail(f"{field} has an invalid IPv6 address in brackets. "
                        f"Received: {_short(address)}.") from None
    if ":" in host:
        raise _fail(f"{field} looks like an IPv6 address without brackets; write "
                    f"'[{host}]:{port}'. Received: {_short(address)}.")
    if not _HOSTNAME.fullmatch(host):
        raise _fail(f"{field} must be 'host:port' with a host name or IP address. "
                    f"Received: {_short(address)}.")
    if re.fullmatch(r"[0-9.]+", host):
        octets = host.split(".")
        if len(octets) != 4 or any(not o or int(o) > 255 for o in octets):
            raise _fail(f"{field} has an invalid IPv4 address. Received: {_short(address)}.")
        if any(len(o) > 1 and o.startswith("0") for o in octets):
            raise _fail(f"{field} has an IPv4 address with leading zeros, which some resolvers "
                        f"read as octal; write {'.'.join(str(int(o)) for o in octets)}. "
                        f"Received: {_short(address)}.")
    return host.lower(), int(port)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


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
    except ValueError as e:  # e.g. an integer over Python's 4300-digit limit
        raise _fail(f"not valid JSON ({str(e)[:100]}). Received: {text[:200]!r}.") from None
    except RecursionError:  # deeply nested brackets
        raise _fail("nested too deeply to be a TF_CONFIG.") from None
    if not isinstance(config, dict):
        raise _fail(f"top level must be an object. Received: {type(config).__name__}.")
    for key in ("cluster", "task"):
        if key not in config:
            raise _fail(f"missing field '{key}'. Received keys: {sorted(config)}.")
    cluster, task = config["cluster"], config["task"]
    if not isinstance(cluster, dict) or not cluster:
        raise _fail(f"field 'cluster' must be a non-empty object. Received: {_short(cluster)}.")
    seen: dict[tuple[str, int], tuple[str, str]] = {}
    for task_type, addresses in cluster.items():
        if task_type not in KNOWN_TASK_TYPES:
            raise _fail(f"cluster has unknown task type {_short(task_type)}; "
                        f"known: {list(KNOWN_TASK_TYPES)}.")
        if not isinstance(addresses, list) or not addresses:
            raise _fail(f"cluster.{task_type} must be a non-empty list of addresses. "
                        f"Received: {_short(addresses)}.")
        for i, address in enumerate(addresses):
            field = f"cluster.{task_type}[{i}]"
            key = split_address(field, address)
            if key in seen:
                other_field, other = seen[key]
                same = "" if other == address else f" (as {other!r})"
                raise _fail(f"duplicate address {address!r} in {other_field}{same} and {field}.")
            seen[key] = (field, address)
    for job in ("chief", "evaluator"):
        if len(cluster.get(job, [])) > 1:
            raise _fail(f"cluster.{job} must list exactly one address (TensorFlow allows at "
                        f"most one {job}). Received: {_short(cluster[job])}.")
    if not isinstance(task, dict):
        raise _fail(f"field 'task' must be an object. Received: {_short(task)}.")
    task_type = task.get("type")
    if not isinstance(task_type, str):
        raise _fail(f"task.type must be a string naming a job of the cluster "
                    f"{sorted(cluster)}. Received: {_short(task_type)}.")
    if task_type == "evaluator":
        raise _fail("task.type 'evaluator': tfdist has no side-car evaluator (the chief "
                    "evaluates the model after training). Do not start an evaluator task; "
                    "evaluate the saved MODEL_DIR/model.keras instead.")
    if task_type not in cluster:
        raise _fail(f"task.type {_short(task_type)} is not a task type in cluster "
                    f"{sorted(cluster)}.")
    if "index" not in task:
        raise _fail(f"task.index is missing (TensorFlow requires it too). Received task: "
                    f"{_short(task)}.")
    index = task["index"]
    if isinstance(index, bool) or not isinstance(index, int):
        raise _fail(f"task.index must be a JSON integer (tfdist is stricter than TensorFlow "
                    f"here). Received: {_short(index)}.")
    if not 0 <= index < len(cluster[task_type]):
        raise _fail(f"task.index {_short(index)} is out of range for cluster.{task_type}, which "
                    f"has {len(cluster[task_type])} address(es).")
    return config


# Set by `tfdist.launch` in each task's environment, beside TF_CONFIG.
LAUNCHER_VAR = "TFDIST_LAUNCHER"
# Also set by `tfdist.launch`: its -n, which survivors relaunched by --min-workers keep.
JOB_WORKERS_VAR = "TFDIST_JOB_WORKERS"


def info_from_tf_config(config: dict[str, Any], source: str = "tf_config") -> ClusterInfo:
    """Builds ClusterInfo from a validated TF_CONFIG dict."""
    cluster, task = config["cluster"], config["task"]
    task_type, task_index = task["type"], task["index"]
    num_chief = len(cluster.get("chief", []))
    num_workers = num_chief + len(cluster.get("worker", []))
    if task_type == "chief":
        worker_index = 0
    elif task_type == "worker":
        worker_index = num_chief + task_index
    else:
        # ps and evaluator tasks are not in the synchronous replica group.
        worker_index = -1
    host = cluster[task_type][task_index].rpartition(":")[0]
    return ClusterInfo(source=source, num_workers=num_workers, worker_index=worker_index,
                       task_type=task_type, task_index=task_index, tf_config=config,
                       hostname=host[1:-1] if host.startswith("[") else host)


class TFConfigEnvironment(ClusterEnvironment):
    """A cluster described by the TF_CONFIG environment variable."""

    name = "tf_config"

    @staticmethod
    def detect(environ) -> bool:
        return bool(environ.get(ENV_VAR, "").strip())

    @staticmethod
    def resolve(environ) -> ClusterInfo:
        info = info_from_tf_config(parse_tf_config(environ[ENV_VAR]))
        # tfdist.launch marks the TF_CONFIGs it writes, so messages can name it.
        launcher = environ.get(LAUNCHER_VAR) or None
        if not launcher:
            return info
        job_workers = (env_count(environ, JOB_WORKERS_VAR, "set by tfdist.launch: its -n.")
                       if JOB_WORKERS_VAR in environ else None)
        return dataclasses.replace(info, launcher=launcher, job_workers=job_workers)
