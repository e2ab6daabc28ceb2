"""SLURM: build the cluster from the variables `srun` sets for each task.

TensorFlow's own `SlurmClusterResolver` shells out to `nvidia-smi` to count
GPUs and crashes on nodes without one (FileNotFoundError), and it uses one
fixed port for every job, so two jobs on a node collide. This module needs
neither: it reads only environment variables and derives ports from the job id.

Variables read (all set by `srun` for every task):
    SLURM_JOB_ID, SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
    SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST), SLURM_STEP_TASKS_PER_NODE
    (else SLURM_TASKS_PER_NODE), SLURM_STEP_ID, SLURMD_NODENAME.
    TFDIST_PORT_BASE overrides the derived first port.
"""

from __future__ import annotations

import dataclasses
import re

from tfdist.cluster.base import ClusterEnvironment, ClusterInfo
from tfdist.errors import ClusterError

PORT_MIN = 20000
PORT_SLOTS = 2000  # distinct job slots: ports PORT_MIN .. PORT_MIN + SLOTS*SPAN
PORT_SPAN = 20  # ports per job per node, so at most 20 tasks per node


def _split_top_level(text: str) -> list[str]:
    """Splits on commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in host list {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"unbalanced '[' in host list {text!r}")
    parts.append(text[start:])
    return [p for p in parts if p]


def _expand_ranges(body: str, whole: str) -> list[str]:
    values = []
    for item in body.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if not m:
            raise ValueError(f"bad range {item!r} in host list {whole!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"descending range {item!r} in host list {whole!r}")
        width = len(lo)  # node[01-03] keeps its zero padding
        values.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return values


def expand_hostlist(text: str) -> list[str]:
    """Expands a Slurm compressed host list.

    Args:
        text: For example ``"node[01-03,07],gpu5"`` or ``"r[1-2]-n[1-2]"``.

    Returns:
        The host names in order, e.g. ``["node01", "node02", "node03",
        "node07", "gpu5"]``.

    Raises:
        ValueError: on unbalanced brackets or malformed ranges.
    """
    hosts: list[str] = []
    for part in _split_top_level(text.strip()):
        m = re.search(r"\[([^\[\]]*)\]", part)
        if m is None:
            hosts.append(part)
            continue
        head, tail = part[:m.start()], part[m.end():]
        for value in _expand_ranges(m.group(1), text):
            # The tail may hold further bracket groups: expand recursively.
            hosts.extend(expand_hostlist(head + value + tail))
    if not hosts:
        raise ValueError(f"empty host list {text!r}")
    return hosts


def expand_tasks_per_node(text: str) -> list[int]:
    """Expands a Slurm tasks-per-node string such as ``"2(x3),1"``.

    Returns:
        One count per node, e.g. ``[2, 2, 2, 1]``.

    Raises:
        ValueError: on a malformed entry.
    """
    counts: list[int] = []
    for item in text.strip().split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not m:
            raise ValueError(f"bad entry {item!r} in tasks-per-node {text!r}")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def port_base_for_job(job_id: int) -> int:
    """First port of a job's block, so concurrent jobs on a node differ."""
    return PORT_MIN + (job_id % PORT_SLOTS) * PORT_SPAN


def _get(environ, *names: str) -> str:
    for name in names:
        if environ.get(name, "") != "":
            return environ[name]
    raise ClusterError(
        f"SLURM environment is incomplete: {' / '.join(names)} is not set.\n"
        "HINT: start every worker with `srun` inside the allocation "
        "(`srun python -m tfdist.train ...`), not directly from the batch script.")


def _get_int(environ, name: str) -> int:
    value = _get(environ, name)
    if not value.isdigit():
        raise ClusterError(f"{name} must be a non-negative integer. Received: {value!r}.")
    return int(value)


def slurm_tf_config(hosts: list[str], tasks_per_node: list[int], port_base: int) -> dict:
    """Pure function: the TF_CONFIG cluster for Slurm's block task layout.

    Task ranks are laid out node by node (Slurm's default block distribution):
    node 0 holds ranks 0..n0-1, node 1 the next n1, and so on; each task on a
    node gets port `port_base + local_rank`.
    """
    workers = [f"{host}:{port_base + local}"
               for host, n in zip(hosts, tasks_per_node) for local in range(n)]
    return {"cluster": {"worker": workers}}


def ps_roles(ntasks: int, num_ps: int) -> list[tuple[str, int]]:
    """Pure function: (task type, index) per Slurm rank for parameter-server training.

    Rank 0 is the chief (the coordinator), ranks 1..num_ps the ps tasks, and
    every other rank a worker.

    Raises:
        ClusterError: when the step has too few tasks for a chief, the ps tasks
            and at least one worker.
    """
    if num_ps < 1 or ntasks < num_ps + 2:
        raise ClusterError(
            f"A parameter-server job needs a chief, TFDIST_NUM_PS ps task(s) and at least one "
            f"worker. Received: SLURM_NTASKS={ntasks}, TFDIST_NUM_PS={num_ps}.\n"
            f"HINT: request at least {max(num_ps, 1) + 2} tasks, or lower TFDIST_NUM_PS.")
    return [("chief", 0)] + [("ps", i) for i in range(num_ps)] + [
        ("worker", i) for i in range(ntasks - num_ps - 1)]


def ps_tf_config(addresses: list[str], num_ps: int, procid: int) -> dict:
    """Pure function: TF_CONFIG for rank `procid` of a parameter-server step.

    Args:
        addresses: One "host:port" per Slurm rank, in rank order.
        num_ps: Parameter-server tasks.
        procid: This task's rank.
    """
    roles = ps_roles(len(addresses), num_ps)
    cluster: dict[str, list[str]] = {"chief": [], "worker": [], "ps": []}
    for (task_type, _), address in zip(roles, addresses):
        cluster[task_type].append(address)
    task_type, index = roles[procid]
    return {"cluster": cluster, "task": {"type": task_type, "index": index}}


class SlurmEnvironment(ClusterEnvironment):
    """A job step started by `srun`: one task per worker."""

    name = "slurm"

    @staticmethod
    def detect(environ) -> bool:
        # Ranks that horovodrun/mpirun started inside an allocation inherit the batch
        # shell's SLURM_* variables but are not Slurm tasks: their launcher places them.
        if "HOROVOD_RANK" in environ or "OMPI_COMM_WORLD_RANK" in environ:
            return False
        # A multi-task allocation without a task id (an `salloc` shell) is detected
        # too, so that `resolve` can say "use srun" instead of training alone.
        return "SLURM_JOB_ID" in environ and (
            "SLURM_PROCID" in environ or environ.get("SLURM_NTASKS", "1") not in ("", "0", "1"))

    @staticmethod
    def resolve(environ) -> ClusterInfo:
        job_id = _get_int(environ, "SLURM_JOB_ID")
        ntasks = _get_int(environ, "SLURM_NTASKS")
        if ntasks > 1 and "SLURM_STEP_ID" not in environ:
            where = ("the batch script itself" if "SLURM_PROCID" in environ
                     else "the allocation's shell (salloc), not one of its tasks")
            raise ClusterError(
                f"SLURM_NTASKS={ntasks} but this process is {where} "
                "(SLURM_STEP_ID is not set), so the other workers were never started.\n"
                "HINT: launch with `srun python -m tfdist.train ...` inside the allocation "
                "(see slurm/multi_worker.sbatch).")
        procid = _get_int(environ, "SLURM_PROCID")
        localid = _get_int(environ, "SLURM_LOCALID")
        nodelist = _get(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
        tpn_text = _get(environ, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
        try:
            hosts = expand_hostlist(nodelist)
            tasks_per_node = expand_tasks_per_node(tpn_text)
        except ValueError as e:
            raise ClusterError(f"Cannot parse the SLURM node layout: {e}.") from None
        if len(hosts) != len(tasks_per_node):
            raise ClusterError(
                f"SLURM node list {nodelist!r} names {len(hosts)} node(s) but tasks-per-node "
                f"{tpn_text!r} gives {len(tasks_per_node)} count(s).")
        if sum(tasks_per_node) != ntasks:
            raise ClusterError(
                f"SLURM tasks-per-node {tpn_text!r} adds up to {sum(tasks_per_node)} but "
                f"SLURM_NTASKS={ntasks}.\nHINT: request tasks with --ntasks-per-node or "
                "--ntasks and start them with a plain `srun` of the whole allocation.")
        if not 0 <= procid < ntasks:
            raise ClusterError(f"SLURM_PROCID={procid} is out of range for SLURM_NTASKS={ntasks}.")
        # Rank -> node under block distribution; cyclic layouts would mismatch.
        node = next(i for i in range(len(hosts)) if procid < sum(tasks_per_node[:i + 1]))
        expected_local = procid - sum(tasks_per_node[:node])
        nodename = environ.get("SLURMD_NODENAME")
        if localid != expected_local or (nodename and nodename != hosts[node]):
            raise ClusterError(
                f"SLURM task {procid} runs on {nodename or '?'} as local task {localid}, but "
                f"block distribution puts it on {hosts[node]} as local task {expected_local}.\n"
                "HINT: use the default `--distribution=block` for tfdist jobs.")
        if max(tasks_per_node) > PORT_SPAN:
            raise ClusterError(f"At most {PORT_SPAN} tasks per node are supported. "
                               f"Received: tasks-per-node {tpn_text!r}.")
        if environ.get("TFDIST_PORT_BASE"):
            port_base = _get_int(environ, "TFDIST_PORT_BASE")
        else:
            port_base = port_base_for_job(job_id)
        config = slurm_tf_config(hosts, tasks_per_node, port_base)
        num_ps = environ.get("TFDIST_NUM_PS", "")
        if num_ps not in ("", "0"):
            if not num_ps.isdigit():
                raise ClusterError(f"TFDIST_NUM_PS must be a non-negative integer. "
                                   f"Received: {num_ps!r}.")
            from tfdist.cluster.tf_config import info_from_tf_config

            config = ps_tf_config(config["cluster"]["worker"], int(num_ps), procid)
            return dataclasses.replace(info_from_tf_config(config, source="slurm"),
                                       local_rank=localid, hostname=hosts[node])
        config["task"] = {"type": "worker", "index": procid}
        return ClusterInfo(source="slurm", num_workers=ntasks, worker_index=procid,
                           task_type="worker", task_index=procid,
                           tf_config=config if ntasks > 1 else None,
                           local_rank=localid, hostname=hosts[node])
