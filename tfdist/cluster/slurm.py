"""SLURM: build the cluster from the variables `srun` sets for each task.

TensorFlow's own `SlurmClusterResolver` shells out to `nvidia-smi` to count
GPUs and crashes on nodes without one (FileNotFoundError), and it uses one
fixed port for every job, so two jobs on a node collide. This module needs
neither: it reads only environment variables and derives ports from the job id.

Variables read (all set by `srun` for every task):
    SLURM_JOB_ID, SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
    SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST), SLURM_STEP_TASKS_PER_NODE
    (else SLURM_TASKS_PER_NODE), SLURM_STEP_ID, SLURMD_NODENAME, and
    SLURM_STEP_RESV_PORTS when Slurm reserves ports for the step.
    TFDIST_PORT_BASE overrides the first port (see `tfdist.cluster.ports`).
    TFDIST_NUM_PS > 0 makes a parameter-server cluster.

Every malformed value is a ClusterError naming the variable and the value.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from typing import Sequence

from tfdist.cluster import ports as ports_lib
from tfdist.cluster.base import INT_MAX, ClusterEnvironment, ClusterInfo, env_count, parse_count
from tfdist.errors import ClusterError

_SRUN_HINT = ("start every worker with `srun` inside the allocation "
              "(`srun python -m tfdist.train ...`), which sets it.")

MAX_RANGE = 65536  # Slurm's own limit on hosts in one bracket range (hostlist.c MAX_RANGE)
MAX_NODES = 65536  # tfdist's limit on the nodes of one step
_NAME = re.compile(r"[A-Za-z0-9_.-]*", re.ASCII)  # what can go into a 'host:port' address
# "1-" is "1" to Slurm (its strtoul reads nothing after the dash).
_RANGE = re.compile(r"([0-9]{1,18})(?:-([0-9]{0,18}))?", re.ASCII)
_TPN = re.compile(r"([0-9]{1,18})(?:\(x([0-9]{1,18})\))?", re.ASCII)


def _tokens(text: str) -> list[str]:
    """Splits on commas, spaces and tabs that are not inside brackets (as Slurm does)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested '[' in host list {text!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in host list {text!r}")
        elif ch in ", \t" and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"unbalanced '[' in host list {text!r}")
    parts.append(text[start:])
    return [p for p in parts if p]


def _ranges(body: str, whole: str) -> list[tuple[int, int, int]]:
    """(lo, hi, width) of each item of a bracket, e.g. '01-03,7'."""
    out = []
    for item in body.split(","):
        m = _RANGE.fullmatch(item)
        if not m:
            raise ValueError(f"bad range {item!r} in host list {whole!r}")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ValueError(f"descending range {item!r} in host list {whole!r}")
        if hi - lo + 1 > MAX_RANGE:
            raise ValueError(f"range {item!r} in host list {whole!r} has more than "
                             f"{MAX_RANGE} hosts (Slurm's limit)")
        out.append((lo, hi, len(m.group(1))))  # node[01-03] keeps its zero padding
    return out


def _expand_token(token: str, whole: str) -> list[str]:
    pieces = re.split(r"\[([^\[\]]*)\]", token)  # text, range, text, range, ..., text
    texts, groups = pieces[0::2], [_ranges(body, whole) for body in pieces[1::2]]
    if groups and texts[-1]:
        raise ValueError(f"{token!r} in host list {whole!r} has text after its last ']', "
                         "which Slurm rejects")
    if any(not _NAME.fullmatch(t) for t in texts):
        raise ValueError(f"host name {token!r} in host list {whole!r} has characters other "
                         "than letters, digits, '.', '-' and '_'")
    count = 1
    for group in groups:
        count *= sum(hi - lo + 1 for lo, hi, _ in group)
        if count > MAX_NODES:
            raise ValueError(f"{token!r} in host list {whole!r} names more than {MAX_NODES} "
                             "hosts")
    hosts = [texts[0]]
    for group, text in zip(groups, texts[1:]):
        hosts = [f"{h}{str(n).zfill(w)}{text}" for h in hosts for lo, hi, w in group
                 for n in range(lo, hi + 1)]
    return hosts


def expand_hostlist(text: str) -> list[str]:
    """Expands a Slurm compressed host list, refusing what Slurm itself refuses.

    Args:
        text: For example ``"node[01-03,07],gpu5"`` or ``"r[1-2]-n[1-2]"``.

    Returns:
        The host names in order, e.g. ``["node01", "node02", "node03",
        "node07", "gpu5"]``.

    Raises:
        ValueError: on unbalanced or nested brackets, malformed or descending
            ranges, text after the last bracket (``n[1-2]x``), a range of more
            than 65536 hosts (``n[0-70000]``), more than 65536 hosts in all, or
            a host name that cannot go into an address.
    """
    hosts: list[str] = []
    for token in _tokens(text.strip()):
        hosts.extend(_expand_token(token, text))
        if len(hosts) > MAX_NODES:
            raise ValueError(f"host list {text[:100]!r} names more than {MAX_NODES} hosts")
    if not hosts or not all(hosts):
        raise ValueError(f"empty host name in host list {text!r}")
    return hosts


def expand_tasks_per_node(text: str, max_nodes: int = MAX_NODES) -> list[int]:
    """Expands a Slurm tasks-per-node string such as ``"2(x3),1"``.

    Args:
        text: The value of SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE.
        max_nodes: Refuse a string describing more nodes than this (checked
            before expanding, so ``1(x1000000000000)`` costs nothing).

    Returns:
        One count per node, e.g. ``[2, 2, 2, 1]``.

    Raises:
        ValueError: on a malformed entry or more than `max_nodes` nodes.
    """
    runs = []
    for item in text.strip().split(","):
        m = _TPN.fullmatch(item.strip())
        if not m:
            raise ValueError(f"bad entry {item[:40]!r} in tasks-per-node {text[:100]!r}")
        runs.append((int(m.group(1)), int(m.group(2) or 1)))
        if sum(repeat for _, repeat in runs) > max_nodes:
            raise ValueError(f"tasks-per-node {text[:100]!r} describes more than {max_nodes} "
                             "node(s)")
    return [count for count, repeat in runs for _ in range(repeat)]


def _get(environ, *names: str) -> str:
    for name in names:
        if environ.get(name, "") != "":
            return environ[name]
    raise ClusterError(
        f"SLURM environment is incomplete: {' / '.join(names)} is not set.\n"
        "HINT: start every worker with `srun` inside the allocation "
        "(`srun python -m tfdist.train ...`), not directly from the batch script.")


def _get_int(environ, name: str, maximum: int = INT_MAX) -> int:
    return parse_count(name, _get(environ, name), _SRUN_HINT, maximum)


def slurm_tf_config(hosts: list[str], tasks_per_node: list[int],
                    ports: int | Sequence[int]) -> dict:
    """Pure function: the TF_CONFIG cluster for Slurm's block task layout.

    Task ranks are laid out node by node (Slurm's default block distribution):
    node 0 holds ranks 0..n0-1, node 1 the next n1, and so on; local task i of
    a node gets port `ports[i]` (`ports + i` when `ports` is the first port).
    """
    ports = range(ports, ports + max(tasks_per_node)) if isinstance(ports, int) else ports
    workers = [f"{host}:{ports[local]}"
               for host, n in zip(hosts, tasks_per_node) for local in range(n)]
    return {"cluster": {"worker": workers}}


def step_ports(environ, job_id: int, tasks_per_node: int) -> list[int]:
    """The ports of local tasks 0..tasks_per_node-1 (see `tfdist.cluster.ports`).

    Raises:
        ClusterError: naming the variable, for a bad or too small reservation
            or a TFDIST_PORT_BASE out of range.
    """
    if environ.get("TFDIST_PORT_BASE", "") != "":
        base = parse_count("TFDIST_PORT_BASE", environ["TFDIST_PORT_BASE"],
                           "unset it to derive ports from the job id.", maximum=65535)
        why = ports_lib.check_base(base, tasks_per_node)
        if why:
            raise ClusterError(f"TFDIST_PORT_BASE={base}: {why}.\nHINT: pick a base in "
                               f"{ports_lib.LOWEST}-{65536 - tasks_per_node}, outside "
                               f"{ports_lib.EPHEMERAL[0]}-{ports_lib.EPHEMERAL[1]} (ephemeral), "
                               "or unset it.")
        return list(range(base, base + tasks_per_node))
    reserved = environ.get("SLURM_STEP_RESV_PORTS", "")
    if reserved:
        try:
            ports = ports_lib.parse_port_list(reserved)
        except ValueError as e:
            raise ClusterError(f"SLURM_STEP_RESV_PORTS={reserved[:60]!r} is not a port list "
                               f"({e}).\nHINT: {_SRUN_HINT}") from None
        if len(ports) < tasks_per_node:
            raise ClusterError(
                f"SLURM_STEP_RESV_PORTS={reserved!r} reserves {len(ports)} port(s) but the "
                f"step runs {tasks_per_node} task(s) on a node.\nHINT: srun --resv-ports="
                f"{tasks_per_node} (or leave --resv-ports unset).")
        return ports[:tasks_per_node]
    step = env_count(environ, "SLURM_STEP_ID", _SRUN_HINT, default=0, maximum=2**32 - 1)
    base = ports_lib.derived_base(job_id, step)
    return list(range(base, base + tasks_per_node))


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
        job_id = _get_int(environ, "SLURM_JOB_ID", maximum=2**32 - 1)
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
            raise ClusterError(f"Cannot parse the SLURM node layout: {e}.\nHINT: "
                               f"{_SRUN_HINT}") from None
        if len(hosts) != len(tasks_per_node):
            raise ClusterError(
                f"SLURM node list {nodelist!r} names {len(hosts)} node(s) but tasks-per-node "
                f"{tpn_text!r} gives {len(tasks_per_node)} count(s).")
        if sum(tasks_per_node) != ntasks:
            raise ClusterError(
                f"SLURM tasks-per-node {tpn_text!r} adds up to {sum(tasks_per_node)} but "
                f"SLURM_NTASKS={ntasks}.\nHINT: request tasks with --ntasks-per-node or "
                "--ntasks and start them with a plain `srun` of the whole allocation.")
        if min(tasks_per_node) < 1:
            raise ClusterError(f"SLURM tasks-per-node {tpn_text!r} gives a node no task."
                               f"\nHINT: {_SRUN_HINT}")
        if not 0 <= procid < ntasks:
            raise ClusterError(f"SLURM_PROCID={procid} is out of range for SLURM_NTASKS={ntasks}."
                               f"\nHINT: {_SRUN_HINT}")
        # Rank -> node under block distribution; cyclic layouts would mismatch.
        ends = list(itertools.accumulate(tasks_per_node))
        node = next(i for i, end in enumerate(ends) if procid < end)
        expected_local = procid - (ends[node - 1] if node else 0)
        nodename = environ.get("SLURMD_NODENAME")
        if localid != expected_local or (nodename and nodename != hosts[node]):
            raise ClusterError(
                f"SLURM task {procid} runs on {nodename or '?'} as local task {localid}, but "
                f"block distribution puts it on {hosts[node]} as local task {expected_local}.\n"
                "HINT: use the default `--distribution=block` for tfdist jobs.")
        if max(tasks_per_node) > ports_lib.SPAN:
            raise ClusterError(f"At most {ports_lib.SPAN} tasks per node are supported. "
                               f"Received: tasks-per-node {tpn_text!r}.\nHINT: fewer tasks "
                               "per node (--ntasks-per-node).")
        ports = step_ports(environ, job_id, max(tasks_per_node))
        config = slurm_tf_config(hosts, tasks_per_node, ports)
        num_ps = env_count(environ, "TFDIST_NUM_PS", "the number of ps tasks, e.g. "
                           "TFDIST_NUM_PS=1; unset for synchronous training.", default=0)
        if num_ps:
            from tfdist.cluster.tf_config import info_from_tf_config

            config = ps_tf_config(config["cluster"]["worker"], num_ps, procid)
            return dataclasses.replace(info_from_tf_config(config, source="slurm"),
                                       local_rank=localid, hostname=hosts[node],
                                       launcher="srun")
        config["task"] = {"type": "worker", "index": procid}
        return ClusterInfo(source="slurm", num_workers=ntasks, worker_index=procid,
                           task_type="worker", task_index=procid,
                           tf_config=config if ntasks > 1 else None,
                           local_rank=localid, hostname=hosts[node], launcher="srun")
