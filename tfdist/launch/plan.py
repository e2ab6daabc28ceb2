"""What the launcher computes before it starts anything: pure functions.

The share of cores each worker gets (`core_sets`), free ports on this host
(`free_ports`), the TF_CONFIG of every task of a synchronous
(`worker_tf_configs`) or parameter-server (`ps_tf_configs`) cluster, and
what an exit status says (`describe_exit`, `describe_outcome`). Starts no
process and imports no TensorFlow.
"""

from __future__ import annotations

import signal
import socket

from tfdist import exit_codes

HOST = "127.0.0.1"


def core_sets(cpus: list[int], n: int) -> list[list[int]]:
    """Pure function: `cpus` cut into `n` contiguous, disjoint shares, as even as possible.

    With fewer cpus than workers, workers share them round robin, one each.
    """
    if n < 1 or not cpus:
        raise ValueError(f"need n >= 1 and some cpus. Received: n={n}, cpus={cpus}.")
    if n > len(cpus):
        return [[cpus[i % len(cpus)]] for i in range(n)]
    size, extra = divmod(len(cpus), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(cpus[start:end])
        start = end
    return out


def free_ports(n: int, host: str = HOST) -> list[int]:
    """Returns `n` distinct ports that were free on `host` a moment ago."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _address(endpoint, host: str) -> str:
    """'host:port' for a port on `host`, or for an (address, port) pair."""
    if isinstance(endpoint, tuple):
        return f"{endpoint[0]}:{endpoint[1]}"
    return f"{host}:{endpoint}"


def worker_tf_configs(ports: list, host: str = HOST) -> list[dict]:
    """Pure function: one TF_CONFIG per worker.

    Args:
        ports: Ports on `host`, or (address, port) pairs for workers on several hosts.
        host: The address of every worker given by port alone.
    """
    workers = [_address(p, host) for p in ports]
    return [{"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}
            for i in range(len(ports))]


def ps_tf_configs(num_workers: int, num_ps: int, ports: list,
                  host: str = HOST) -> list[tuple[str, dict]]:
    """Pure function: (label, TF_CONFIG) for a chief, then workers, then ps tasks.

    Args:
        num_workers: Worker tasks (they run the training steps).
        num_ps: Parameter-server tasks (they hold the variables).
        ports: 1 + num_workers + num_ps ports (or (address, port) pairs), in that order.
    """
    if len(ports) != 1 + num_workers + num_ps:
        raise ValueError(f"need {1 + num_workers + num_ps} ports. Received: {len(ports)}.")
    cluster = {"chief": [_address(ports[0], host)],
               "worker": [_address(p, host) for p in ports[1:1 + num_workers]],
               "ps": [_address(p, host) for p in ports[1 + num_workers:]]}
    tasks = [("chief", 0)] + [("worker", i) for i in range(num_workers)] + [
        ("ps", i) for i in range(num_ps)]
    return [("chief" if t == "chief" else f"{t} {i}",
             {"cluster": cluster, "task": {"type": t, "index": i}}) for t, i in tasks]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def wrapped_signal(code: int) -> int | None:
    """Pure function: the signal a wrapper's status 128+N says its child died of (a
    shell, `srun`, a memory cap's wrapper: a SIGKILLed child is their 137), or None.

    tfdist's own statuses in that range (130: interrupted) are not signals.
    """
    if code in PASSED_ON or not 128 < code < 128 + signal.NSIG:
        return None
    return code - 128


def describe_exit(code: int) -> str:
    """'exit code 3', 'killed by SIGKILL' or 'exit code 137: killed by SIGKILL, as its
    wrapper reports it' for a Popen returncode."""
    if code < 0:
        return f"killed by {_signal_name(-code)}"
    wrapped = wrapped_signal(code)
    if wrapped is not None:
        return f"exit code {code}: killed by {_signal_name(wrapped)}, as its wrapper reports it"
    return f"exit code {code}"


# What a worker's tfdist exit status means, for the launcher's report.
OUTCOMES = {0: "ended", exit_codes.INTERRUPTED: "interrupted",
            exit_codes.PREEMPTED: "preempted", exit_codes.PEER_LOST: "lost peer"}


def describe_outcome(code: int) -> str:
    """Pure function: 'interrupted (exit code 130)', 'failed (killed by SIGKILL)', ..."""
    return f"{OUTCOMES.get(code, 'failed')} ({describe_exit(code)})"


# A worker's own tfdist statuses, passed on as the launcher's (`tfdist/exit_codes.py`).
PASSED_ON = (exit_codes.CONFIG, exit_codes.CLUSTER, exit_codes.PEER_LOST, exit_codes.PREEMPTED,
             exit_codes.INTERRUPTED)


def job_status(code: int, lost_host: bool = False) -> int:
    """Pure function: the launcher's exit status when a worker ended with `code`.

    A tfdist status is passed on. A worker that died by a signal (SIGKILL, the
    OOM killer or a memory cap, a crash; also as a wrapper reports it, 128+N:
    `wrapped_signal`), or whose host was lost (`lost_host`: its ssh session
    ended with ssh's own 255), is a lost worker: `exit_codes.PEER_LOST`, the
    status the chief exits with when it loses a peer, so that a wrapper that
    reruns on 4 sees the same whoever reported first. Anything else is 1.

    Args:
        code: The worker's Popen returncode (negative: killed by that signal).
        lost_host: The worker ran on another host that the launcher lost.
    """
    if code in PASSED_ON:
        return code
    if code < 0 or lost_host or wrapped_signal(code) is not None:
        return exit_codes.PEER_LOST
    return exit_codes.FAILED


def log_file_name(label: str) -> str:
    """Pure function: 'worker-0.log' for the task labelled 'worker 0'."""
    return label.replace(" ", "-") + ".log"
