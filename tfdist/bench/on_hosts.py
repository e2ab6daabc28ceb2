"""Benchmark processes on namespaced hosts over shaped links (`--hosts N --rate R`).

`allreduce` and `scaling` take `--hosts N --rate R`: a `tfdist.hosts` cluster
named `tfdist-bench-PID` (this run's own, so benches run at once do not tear
down each other's hosts) of N hosts whose links are shaped to R (tbf, both
directions) is made for the run and removed after; worker i runs on host hi,
one per host, so every byte of a collective crosses a shaped link. MWMS
workers get a TF_CONFIG naming the hosts by address; Horovod ranks are
started by `horovodrun -H h0:1,h1:1,...` run on h0, which reaches the other
hosts over ssh, as on real machines. Needs root (see `tfdist.hosts`).
Imports no TensorFlow.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

from tfdist.bench import runs

CLUSTER_PREFIX = "tfdist-bench-"  # + the bench's pid (names are at most 20 characters)
PORT = 23456  # every host has its own network stack: one fixed port serves all


def link_gbs(rate: str) -> float:
    """Pure function: a link rate ('1gbit', '10gbit', '500mbit') in GB/s (1e9 bytes/s).

    Raises:
        ValueError: for 'none' or an unreadable rate: a bandwidth benchmark needs a shaped link.
    """
    from tfdist.hosts import plan

    bits = plan.parse_rate(rate)
    if bits is None:
        raise ValueError("--hosts needs a shaped link: pass --rate 1gbit, 10gbit or <n>mbit. "
                         f"Received: --rate {rate!r}.")
    return bits / 8 / 1e9


def check_args(hosts: int, rate: str | None) -> float | None:
    """Validates `--hosts N --rate R` before anything starts; the link in GB/s, or None.

    Raises:
        SystemExit: one line saying what was received and what to pass instead.
    """
    if not hosts:
        if rate:
            raise SystemExit(f"error: --rate {rate} needs --hosts N (the links it shapes).")
        return None
    if hosts < 2:
        raise SystemExit(f"error: --hosts must be at least 2. Received: --hosts {hosts}.")
    try:
        return link_gbs(rate or "none")
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


def cluster_name(pid: int) -> str:
    """Pure function: the cluster name of the bench run with process id `pid`."""
    return f"{CLUSTER_PREFIX}{pid}"


def stale_clusters(names: list[str], alive) -> list[str]:
    """Pure function: the bench clusters in `names` whose run (`alive(pid)`) has ended."""
    out = []
    for name in names:
        pid = name[len(CLUSTER_PREFIX):] if name.startswith(CLUSTER_PREFIX) else ""
        if pid.isdigit() and not alive(int(pid)):
            out.append(name)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def shaped_hosts(num_hosts: int, rate: str):
    """A fresh cluster of `num_hosts` hosts at `rate`, this run's own, always removed after.

    Clusters that killed bench runs left behind are removed first.
    """
    from tfdist.hosts import HostRig, unavailable
    from tfdist.hosts.rig import STATE_ROOT

    reason = unavailable()
    if reason:
        raise SystemExit(f"error: --hosts needs namespaced hosts: {reason}")
    existing = os.listdir(STATE_ROOT) if os.path.isdir(STATE_ROOT) else []
    for name in stale_clusters(existing, _alive):
        HostRig(name).down()
    cluster = HostRig(cluster_name(os.getpid()))
    cluster.up(num_hosts, rate=rate)
    try:
        yield cluster
    finally:
        cluster.down()


def tf_configs(addresses: list[str], port: int = PORT) -> list[dict]:
    """Pure function: one TF_CONFIG per worker, worker i at addresses[i]:port."""
    workers = [f"{a}:{port}" for a in addresses]
    return [{"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}
            for i in range(len(workers))]


def host_list(cluster, workers: int) -> str:
    """Pure function of the cluster's layout: horovodrun's `-H h0:1,h1:1,...`."""
    return ",".join(f"{h.name}:1" for h in cluster.hosts[:workers])


def run_workers(cluster, workers: int, module: str, args: list[str], timeout_s: float,
                env: dict | None = None, what: str = "benchmark") -> list[dict]:
    """`python -m MODULE ARGS` on hosts h0..h{workers-1}; returns worker 0's result lines.

    One worker alone gets no TF_CONFIG (it runs `single`). On failure or
    timeout every worker is killed.

    Raises:
        RuntimeError: when a worker fails or worker 0 prints no result, with the output's tail.
    """
    configs = tf_configs([h.address for h in cluster.hosts[:workers]]) if workers > 1 else [None]
    def start(i, cfg):
        extra = {**(env or {}), **({"TF_CONFIG": json.dumps(cfg)} if cfg else {})}
        return lambda out: cluster.popen(
            cluster.hosts[i].name, [sys.executable, "-m", module, *args],
            env=runs.child_env(extra), cwd=runs.REPO, stdout=out, stderr=subprocess.STDOUT,
            text=True)

    procs, texts = runs.start_and_wait([start(i, cfg) for i, cfg in enumerate(configs)],
                                       timeout_s)
    results = runs.parse(texts[0])
    if any(p.returncode != 0 for p in procs) or not results:
        codes = [p.returncode for p in procs]
        raise RuntimeError(f"{what} on hosts failed (exit codes {codes}): python -m {module}\n"
                           + "\n".join(f"--- worker {i}:\n{t[-2000:]}" for i, t in enumerate(texts)))
    return results


def run_horovod(cluster, venv: str, workers: int, controller: str, module: str,
                args: list[str], timeout_s: float, env: dict | None = None,
                mpi_args: str = "", what: str = "benchmark") -> list[dict]:
    """`horovodrun -np N -H h0:1,.. --gloo|--mpi` run on h0; returns its result lines."""
    cmd = runs.horovod_command(venv, workers, controller, module, args, mpi_args)
    # runs.horovod_command places every rank on localhost: put them on the hosts instead.
    cmd[cmd.index("-H") + 1] = host_list(cluster, workers)
    proc = subprocess.run(cluster.command("h0", cmd), capture_output=True, text=True,
                          timeout=timeout_s, env=runs.child_env(env), cwd=runs.REPO)
    results = runs.parse(proc.stdout)
    if proc.returncode != 0 or not results:
        raise RuntimeError(f"{what} on hosts failed (rc={proc.returncode}): {' '.join(cmd)}\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return results
