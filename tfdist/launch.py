"""`python -m tfdist.launch -n N [--timeout S] [--max-restarts R] -- COMMAND ...`.

`python -m tfdist.launch --ps N --workers M -- COMMAND ...` starts a
parameter-server cluster instead: a chief, M workers and N ps tasks, each
running COMMAND with its role in TF_CONFIG (see `run_ps`).

Like `torchrun --standalone`: picks N free ports on 127.0.0.1, gives each
worker a TF_CONFIG, prefixes every output line with the worker index, and
when any worker fails stops the others and exits non-zero naming which worker
failed and how. With `--max-restarts R` it then relaunches all workers (up to
R times), which resume from the chief's last backup. With `--min-workers M`
a worker that still fails after R restarts is left out and the survivors go
on (at least M of them), from the same backup at the same global batch: the
same math on fewer replicas. Imports no TensorFlow.

    python -m tfdist.launch -n 2 -- python -m tfdist.train digits_mlp --strategy multi_worker
    python -m tfdist.launch -n 2 -- python -m tfdist.train wide_mlp --strategy shm

With `--strategy shm` no TensorFlow server starts: worker 0's port is the
shared-memory engine's rendezvous.

`--hosts h0:2,h1:2` starts the workers on other hosts over ssh instead (as
horovodrun does; see `tfdist.remote`): the slots are filled in order (worker
0 and 1 on h0, 2 and 3 on h1), each worker's TF_CONFIG names its host's
address and a port found free there, the launcher's working directory and
environment (PATH, PYTHONPATH, TF_CPP_MIN_LOG_LEVEL, TFDIST_*, `-x NAME`) go
with it, and a worker dies with its ssh session, so none outlives the
launcher on any host. `--ps N --workers M --hosts ...` places the chief,
workers and ps the same way. ssh uses `--ssh-config FILE`; by default the
namespaced cluster's (`python -m tfdist.hosts up N`) when it is up, else the
user's own ssh configuration.

    python -m tfdist.hosts up 2
    python -m tfdist.launch --hosts h0:1,h1:1 -- python -m tfdist.train digits_mlp --strategy multi_worker

The gRPC ports TensorFlow opens are unauthenticated. Local workers are named
by 127.0.0.1 and remote ones by their host's address, but TensorFlow's server
listens on that port on every address of its host (it has no bind-address
option; measured: `*:PORT` in `ss -ltn`), so run it on a trusted network.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from tfdist import exit_codes, remote
from tfdist.cluster.tf_config import JOB_WORKERS_VAR
from tfdist.errors import ClusterError, ConfigError

HOST = "127.0.0.1"
GRACE_S = 10.0  # between SIGTERM and SIGKILL when stopping workers
# The same after a worker failed: the others cannot save (a save needs every
# worker to agree on a step), so SIGTERM only gives them time to exit on their
# own and say which peer they lost; one stuck in a collective or in TensorFlow's
# start-up (whose SIGTERM handler only logs) would hold the relaunch GRACE_S.
FAILED_GRACE_S = 3.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h
# Loaded before any fork: the child only calls it.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _child_setup(launcher_pid: int, cpus: list[int] | None = None) -> None:
    """Runs in each worker between fork and exec.

    Workers die with the launcher: the kernel SIGKILLs them when it goes,
    however it goes (a SIGKILL gives it no chance to stop them), so they never
    train on unsupervised into the next run's model dir. Their stdout and
    stderr pipes closing is the second signal (`tfdist.lifeline`). SIGINT and
    SIGTERM are reset to their defaults: a launcher started with SIGINT
    ignored (`cmd &` in a script) must still be able to interrupt them.
    """
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != launcher_pid:  # the launcher died before prctl
            os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if cpus:  # --cpu-bind cores: inherited by every thread the worker starts
        os.sched_setaffinity(0, cpus)


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


def describe_exit(code: int) -> str:
    """'exit code 3' or 'killed by SIGKILL' for a Popen returncode."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


# What a worker's tfdist exit status means, for the launcher's report.
OUTCOMES = {0: "ended", exit_codes.INTERRUPTED: "interrupted",
            exit_codes.PREEMPTED: "preempted", exit_codes.PEER_LOST: "lost peer"}
SIGNAL_GRACE_S = 60.0  # after forwarding SIGINT/SIGTERM: time for workers to agree and save


def describe_outcome(code: int) -> str:
    """Pure function: 'interrupted (exit code 130)', 'failed (killed by SIGKILL)', ..."""
    return f"{OUTCOMES.get(code, 'failed')} ({describe_exit(code)})"


def log_file_name(label: str) -> str:
    """Pure function: 'worker-0.log' for the task labelled 'worker 0'."""
    return label.replace(" ", "-") + ".log"


def _pump(stream, prefix: str, out, log=None, lock=None) -> None:
    for line in iter(stream.readline, b""):
        out.buffer.write(prefix.encode() + line)
        out.flush()
        if log is not None:
            with lock:  # stdout and stderr of one task share its file
                log.write(line)
                log.flush()
    stream.close()


def _stop(procs: list[subprocess.Popen], grace_s: float = GRACE_S) -> None:
    # RemoteProcess forwards both through its ssh session; a host that cannot be
    # reached has its worker stopped by that session's end instead.
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class _TaskGroup:
    """Processes of one launch: spawned with their TF_CONFIGs, output prefixed,
    SIGINT/SIGTERM forwarded; on exit all are stopped and the handlers restored.

    A task is (label, TF_CONFIG) here, or (label, TF_CONFIG, host) to run it on
    `host` over ssh (`hosts` says how).
    """

    def __init__(self, command: list[str], tasks: list[tuple], env: dict | None,
                 log_dir: str | None = None, append: bool = False,
                 hosts: "_Remote | None" = None, cpu_sets: list | None = None):
        base_env = dict(os.environ if env is None else env)
        base_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        base_env.setdefault("PYTHONUNBUFFERED", "1")
        self.labels = [task[0] for task in tasks]
        self.procs, self._pumps, self._logs = [], [], []
        self.signalled: int | None = None  # SIGINT/SIGTERM received and forwarded
        self.signalled_at, self.forced = 0.0, False
        self.grace_s = GRACE_S  # FAILED_GRACE_S once a worker has failed
        launcher_pid = os.getpid()
        cpu_sets = cpu_sets or [None] * len(tasks)
        for (label, cfg, *on), cpus in zip(tasks, cpu_sets):
            log = lock = None
            if log_dir:  # unprefixed, one file per task, besides the prefixed console
                log = open(os.path.join(log_dir, log_file_name(label)), "ab" if append else "wb")
                lock = threading.Lock()
                self._logs.append(log)
            # TFDIST_LAUNCHER lets a worker name this launcher in its messages.
            task_env = {**base_env, "TF_CONFIG": json.dumps(cfg),
                        "TFDIST_LAUNCHER": "tfdist.launch"}
            spawn = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=lambda cpus=cpus: _child_setup(launcher_pid, cpus))
            if on and on[0] is not None:
                label = f"{label}@{on[0]}"
                p = hosts.start(on[0], command, task_env, **spawn)
            else:
                p = subprocess.Popen(command, env=task_env, stdin=subprocess.DEVNULL, **spawn)
            self.procs.append(p)
            for stream, out in ((p.stdout, sys.stdout), (p.stderr, sys.stderr)):
                t = threading.Thread(target=_pump, args=(stream, f"[{label}] ", out, log, lock),
                                     daemon=True)
                t.start()
                self._pumps.append(t)

    def _forward(self, signum, _frame):
        if self.signalled is not None:
            self.forced = True  # a second Ctrl-C: stop now, do not wait for saves
        else:
            self.signalled, self.signalled_at = signum, time.monotonic()
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signum)

    def __enter__(self):
        self._old = {s: signal.signal(s, self._forward) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc):
        _stop(self.procs, self.grace_s)
        for t in self._pumps:
            t.join(timeout=5)
        for log in self._logs:
            log.close()
        for s, handler in self._old.items():
            signal.signal(s, handler)
        return False


class _Remote:
    """Where remote tasks go: hosts with slots, their addresses, how to ssh there."""

    def __init__(self, hosts: list[tuple[str, int]], ssh_config: str | None,
                 forward: tuple[str, ...] = (), addresses: dict | None = None):
        self.hosts, self.ssh_config, self.forward = hosts, ssh_config, forward
        self.addresses = addresses or {h: remote.resolve(h, ssh_config) for h, _ in hosts}

    def without(self, gone=frozenset(), one_slot_of: str | None = None) -> "_Remote":
        """These hosts less `gone` and less one slot of `one_slot_of` (see remote.without)."""
        return _Remote(remote.without(self.hosts, gone, one_slot_of), self.ssh_config,
                       self.forward, self.addresses)

    def spec(self) -> str:
        return ",".join(f"{h}:{n}" for h, n in self.hosts)

    def unreachable(self) -> dict[str, str]:
        """{host: why} for the hosts that do not answer over ssh now."""
        return remote.unreachable([h for h, _ in self.hosts], self.ssh_config)

    def placement(self, num_tasks: int) -> list[tuple[str, str, int]]:
        """(host, address, free port) for each task, slots filled in order."""
        on = remote.place(num_tasks, self.hosts)
        ports = {h: iter(remote.probe_ports(h, self.addresses[h], on.count(h), self.ssh_config,
                                            sys.executable))
                 for h, _ in self.hosts if h in on}
        return [(h, self.addresses[h], next(ports[h])) for h in on]

    def start(self, host: str, command: list[str], env: dict, **kwargs) -> subprocess.Popen:
        return remote.RemoteProcess(host, command, remote.forwarded_env(env, self.forward),
                                    os.getcwd(), self.ssh_config, **kwargs)


def _placed(num_tasks: int, where: "_Remote | None") -> tuple[list, list, list[str]]:
    """(ports, host per task, ' on HOST (ADDRESS)' per task) for local or remote tasks."""
    if where is None:
        return free_ports(num_tasks), [None] * num_tasks, [""] * num_tasks
    placed = where.placement(num_tasks)
    return ([(a, p) for _, a, p in placed], [h for h, _, _ in placed],
            [f" on {h} ({a})" for h, a, _ in placed])


def _describe(code: int, host: str | None) -> str:
    if host is not None and code == remote.SSH_FAILED:
        return f"ssh to {host} failed or lost its connection (ssh exit 255)"
    return describe_exit(code)


# Statuses that a restart cannot fix: bad input, or a requested stop.
NO_RESTART = (exit_codes.CONFIG, exit_codes.CLUSTER, exit_codes.PREEMPTED)


def run(num_workers: int, command: list[str], timeout_s: float | None = None,
        env: dict | None = None, max_restarts: int = 0, log_dir: str | None = None,
        hosts: "_Remote | None" = None, min_workers: int | None = None,
        cpu_bind: str = "none") -> int:
    """Runs `command` as `num_workers` workers and supervises them.

    When a worker fails, the others are stopped; with restarts left, all
    workers are started again (on fresh ports) and resume from the last
    backup, unless the failure was bad input or a preemption, or the
    launcher itself was interrupted (SIGINT/SIGTERM: a stop, not a failure).
    With `min_workers` below `num_workers`, a worker that still fails when
    the restarts are spent is left out: the survivors are relaunched, with
    `max_restarts` restarts again, as long as at least `min_workers` remain.
    They resume from the last backup at the same global batch, which is the
    same math on fewer replicas; a global batch that does not divide among
    them is refused by the workers (exit 2, naming both numbers).

    Args:
        hosts: Where to start them over ssh (`--hosts`); None: on 127.0.0.1.
        cpu_bind: "cores": each worker on this machine runs on its own share
            of the cores the launcher may use (`core_sets`); "none": anywhere.

    Returns:
        0 when every worker exits 0; the failed worker's status when it is a
        tfdist status (2 config, 3 cluster, 4 peer lost, 75 preempted), else
        1; 124 on timeout; 130 after SIGINT. The cause is printed to stderr.
    """
    deadline = None if not timeout_s else time.monotonic() + timeout_s
    min_workers = num_workers if min_workers is None else min_workers
    # The workers asked for, on every launch: survivors name the same default model
    # dir (tfdist.run.run_dir counts them), so they resume the run instead of starting one.
    env = {**(os.environ if env is None else env), JOB_WORKERS_VAR: str(num_workers)}
    attempt, launches = 0, 0
    while True:
        status, (failed_index, failed_code, failed_host), signalled = _run_once(
            num_workers, command, deadline, timeout_s, env, log_dir, append=launches > 0,
            hosts=hosts, cpu_bind=cpu_bind)
        launches += 1
        if signalled is not None and status != 0:
            print(f"tfdist.launch: stopped by {signal.Signals(signalled).name}; not "
                  "restarting.", file=sys.stderr, flush=True)
            return 128 + signal.SIGINT if signalled == signal.SIGINT else status
        if status in (0, 124) or failed_code in NO_RESTART:
            return status
        lost = hosts.unreachable() if hosts is not None else {}
        if lost:  # a host that does not answer cannot take a restart: go on without it
            survivors = hosts.without(set(lost))
            left = min(num_workers, sum(n for _, n in survivors.hosts))
            named = ", ".join(f"{h} ({hosts.addresses[h]}): {why}" for h, why in lost.items())
            if left < max(1, min_workers):
                print(f"tfdist.launch: host(s) unreachable: {named}; not relaunching: {left} "
                      f"worker(s) would remain, fewer than --min-workers {min_workers}.",
                      file=sys.stderr, flush=True)
                return status
            print(f"tfdist.launch: host(s) unreachable: {named}; relaunching with {left} "
                  f"worker(s) on {survivors.spec()} (--min-workers {min_workers}); they resume "
                  "from the last backup at the same global batch.", file=sys.stderr, flush=True)
            hosts, num_workers, attempt = survivors, left, 0
            continue
        if attempt >= max_restarts:
            if num_workers - 1 < max(1, min_workers):
                return status
            where = ""
            if hosts is not None:  # its slot goes: the survivors keep their hosts
                hosts = hosts.without(one_slot_of=failed_host)
                where = f" on {hosts.spec()}"
            print(f"tfdist.launch: worker {failed_index} did not come back "
                  f"({describe_exit(failed_code)} after {max_restarts} restart(s)); "
                  f"relaunching with the {num_workers - 1} surviving worker(s){where} "
                  f"(--min-workers {min_workers}); they resume from the last backup at the "
                  "same global batch.", file=sys.stderr, flush=True)
            num_workers, attempt = num_workers - 1, 0
            continue
        attempt += 1
        print(f"tfdist.launch: restarting all {num_workers} worker(s) "
              f"(restart {attempt} of {max_restarts}); they resume from the last backup.",
              file=sys.stderr, flush=True)


def _run_once(num_workers, command, deadline, timeout_s, env, log_dir=None, append=False,
              hosts=None, cpu_bind="none"):
    """One launch of all workers: (status, (index, exit code, host) of the failed worker
    or (None, None, None), the signal the launcher forwarded or None)."""
    ports, on, where = _placed(num_workers, hosts)
    tasks = [(f"worker {i}", cfg, on[i]) for i, cfg in enumerate(worker_tf_configs(ports))]
    cpu_sets = None
    local = [i for i in range(num_workers) if on[i] is None]
    if cpu_bind == "cores" and local:  # workers on this machine only
        shares = dict(zip(local, core_sets(sorted(os.sched_getaffinity(0)), len(local))))
        cpu_sets = [shares.get(i) for i in range(num_workers)]
    status, i, failed_code = 0, None, None
    with _TaskGroup(command, tasks, env, log_dir, append, hosts, cpu_sets) as group:
        procs = group.procs
        while True:
            codes = [p.poll() for p in procs]
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failed and group.signalled is not None and not group.forced and (
                    None in codes and time.monotonic() < group.signalled_at + SIGNAL_GRACE_S):
                time.sleep(0.1)  # forwarded a stop: let every worker save and report itself
                continue
            if failed:
                # A worker that lost its peer is a consequence; name the cause if seen.
                failed.sort(key=lambda f: f[1] == exit_codes.PEER_LOST)
                i, failed_code = failed[0]
                if group.signalled is not None:
                    outcomes = ", ".join(f"worker {j} {describe_outcome(c)}"
                                         for j, c in enumerate(codes) if c is not None)
                    message = (f"tfdist.launch: {signal.Signals(group.signalled).name}: "
                               f"{outcomes}.")
                else:
                    group.grace_s = FAILED_GRACE_S
                    outcome = (f"failed ({_describe(failed_code, on[i])})"
                               if on[i] and failed_code == remote.SSH_FAILED
                               else describe_outcome(failed_code))
                    message = (f"tfdist.launch: worker {i}{where[i]} {outcome}; "
                               f"stopping the other {num_workers - 1} worker(s).")
                known = (exit_codes.CONFIG, exit_codes.CLUSTER, exit_codes.PEER_LOST,
                         exit_codes.PREEMPTED, exit_codes.INTERRUPTED)
                status = failed_code if failed_code in known else 1
                # Said now, not after the others are stopped: stopping an unreachable
                # host's worker takes FAILED_GRACE_S.
                print(message, file=sys.stderr, flush=True)
                break
            if all(c == 0 for c in codes):
                break
            if deadline is not None and time.monotonic() > deadline:
                running = [i for i, c in enumerate(codes) if c is None]
                print(f"tfdist.launch: timed out after {timeout_s:g}s; worker(s) {running} "
                      "still running; stopping them.", file=sys.stderr, flush=True)
                status = 124
                break
            time.sleep(0.1)
    return status, (i, failed_code, None if i is None else on[i]), group.signalled


PS_GRACE_S = 30.0  # after a ps dies, time the chief gets to report it before being stopped


def run_ps(num_workers: int, num_ps: int, command: list[str], timeout_s: float | None = None,
           env: dict | None = None, log_dir: str | None = None,
           hosts: "_Remote | None" = None) -> int:
    """Runs `command` as a local parameter-server cluster and supervises it.

    The job is the chief's: it ends when the chief exits, and the servers
    (workers, ps) are stopped then. A worker that dies does not end it (the
    coordinator re-runs its steps elsewhere); it is reported. A ps that dies
    takes part of the model with it: the chief is given PS_GRACE_S to report
    that and exit, then everything is stopped.

    Args:
        hosts: Where to start the tasks over ssh (`--hosts`, filled in the
            order chief, workers, ps); None: on 127.0.0.1.

    Returns:
        The chief's status: 0 on success, 1 if it (or the job) failed, 124 on
        timeout. Causes are printed to stderr.
    """
    ports, on, where = _placed(1 + num_workers + num_ps, hosts)
    configs = ps_tf_configs(num_workers, num_ps, ports)
    labels = [label for label, _ in configs]
    tasks = [(label, cfg, on[i]) for i, (label, cfg) in enumerate(configs)]

    def say(message):
        print(f"tfdist.launch: {message}", file=sys.stderr, flush=True)

    deadline = None if not timeout_s else time.monotonic() + timeout_s
    reported, ps_deadline, status = set(), None, 0
    with _TaskGroup(command, tasks, env, log_dir, hosts=hosts) as group:
        procs = group.procs
        while True:
            chief = procs[0].poll()
            if chief is not None:
                if chief != 0:
                    say(f"chief{where[0]} failed ({_describe(chief, on[0])}); "
                        "stopping the servers.")
                    status = 1
                elif ps_deadline is not None:
                    status = 1  # the chief cannot have trained without its ps
                break
            for i, (label, p) in enumerate(zip(labels, procs)):
                code = p.poll()
                if i == 0 or code is None or i in reported:
                    continue
                reported.add(i)
                if label.startswith("worker"):
                    say(f"{label}{where[i]} exited ({_describe(code, on[i])}); the coordinator "
                        "re-runs its steps on the other workers and the job goes on.")
                else:
                    say(f"{label}{where[i]} exited ({_describe(code, on[i])}); it held model "
                        "variables, so "
                        f"the job cannot finish; giving the chief {PS_GRACE_S:g}s to report.")
                    ps_deadline = time.monotonic() + PS_GRACE_S
            worker_procs = [p for label, p in zip(labels, procs) if label.startswith("worker")]
            if all(p.poll() is not None for p in worker_procs):
                say(f"all {num_workers} worker(s) have exited; nothing is left to train on. "
                    "Stopping the job.")
                status = 1
                break
            if ps_deadline is not None and time.monotonic() > ps_deadline:
                say("the chief did not exit after losing a ps; stopping the job.")
                status = 1
                break
            if deadline is not None and time.monotonic() > deadline:
                say(f"timed out after {timeout_s:g}s; stopping the job.")
                status = 124
                break
            time.sleep(0.1)
    return status


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    argv = sys.argv[1:] if argv is None else argv
    if "--" in argv:
        split = argv.index("--")
        own, command = argv[:split], argv[split + 1:]
    else:
        own, command = argv, []
    parser = argparse.ArgumentParser(
        prog="python -m tfdist.launch",
        description="Run N workers of COMMAND on 127.0.0.1, each with its own TF_CONFIG. "
                    "Everything after '--' is COMMAND, run as is by every worker; its output "
                    "is printed with a [worker I] prefix.",
        usage="python -m tfdist.launch (-n N | --hosts H:S,... | --ps N --workers M "
              "[--hosts H:S,...]) [--timeout S] [--max-restarts R [--min-workers M]] "
              "[--cpu-bind cores] [--log-dir DIR] -- COMMAND ...")
    parser.add_argument("-n", "--num-workers", type=int, default=None,
                        help="synchronous workers to start (MWMS, shm)")
    parser.add_argument("--hosts", default=None,
                        help="HOST:SLOTS,... (e.g. h0:2,h1:2): start the workers there over ssh")
    parser.add_argument("--ssh-config", default=None,
                        help="ssh config for --hosts (default: the namespaced cluster's from "
                             "`python -m tfdist.hosts up`, when it is up)")
    parser.add_argument("-x", dest="forward", action="append", default=[], metavar="NAME",
                        help="also pass environment variable NAME to remote workers")
    parser.add_argument("--ps", type=int, default=None,
                        help="parameter-server cluster: a chief, --workers M workers and N ps")
    parser.add_argument("--workers", type=int, default=None, help="workers, with --ps")
    parser.add_argument("--timeout", type=float, default=None,
                        help="stop all workers after S seconds (exit 124)")
    parser.add_argument("--max-restarts", type=int, default=0,
                        help="relaunch all workers up to R times after a failure")
    parser.add_argument("--min-workers", type=int, default=None,
                        help="when a worker still fails after R restarts, go on without it "
                             "while at least M workers remain (default: N, never shrink)")
    parser.add_argument("--cpu-bind", choices=("none", "cores"), default="none",
                        help="cores: each worker on this machine gets its own share of its "
                             "cores (sched_setaffinity); 2 MWMS workers on 2 cores trained "
                             "synthetic_cnn 6%% faster so (default: none)")
    parser.add_argument("--log-dir", default=None,
                        help="also write each task's output, unprefixed, to DIR/worker-I.log "
                             "(chief.log, ps-I.log with --ps)")
    args = parser.parse_args(own)
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    hosts = None
    if args.hosts is not None:
        if args.num_workers is not None:
            parser.error(f"--hosts {args.hosts} already says how many workers run where; -n N "
                         f"is for workers on this machine. Received: -n {args.num_workers} "
                         f"with --hosts {args.hosts}.")
        try:
            slots = remote.parse_hosts(args.hosts)
            if args.ps is not None and args.workers is not None:
                remote.place(1 + args.ps + args.workers, slots)
            hosts = _Remote(slots, args.ssh_config or _default_ssh_config(), tuple(args.forward))
        except ConfigError as e:
            parser.error(str(e))
        except ClusterError as e:
            print(f"tfdist.launch: {e}", file=sys.stderr)
            return exit_codes.CLUSTER
        if args.ps is None and args.workers is None:
            args.num_workers = sum(n for _, n in slots)
    elif args.ssh_config or args.forward:
        parser.error("--ssh-config and -x go with --hosts.")
    try:
        return _dispatch(parser, args, command, hosts)
    except ConfigError as e:
        parser.error(str(e))
    except ClusterError as e:
        print(f"tfdist.launch: {e}", file=sys.stderr)
        return exit_codes.CLUSTER


def _default_ssh_config() -> str | None:
    """The namespaced `tfdist` cluster's ssh config when it is up, else None (the user's)."""
    from tfdist.hosts import Cluster

    path = Cluster().ssh_config
    return path if os.path.exists(path) else None


def _dispatch(parser, args, command, hosts) -> int:
    if args.ps is not None or args.workers is not None:
        if args.num_workers is not None:
            parser.error("use either -n N (synchronous workers) or --ps N --workers M "
                         f"(parameter server). Received: -n {args.num_workers} with "
                         f"--ps {args.ps} --workers {args.workers}.")
        if args.ps is None or args.workers is None or args.ps < 1 or args.workers < 1:
            parser.error("--ps and --workers go together, each >= 1. Received: "
                         f"--ps {args.ps} --workers {args.workers}.")
        if not command:
            parser.error("no COMMAND given after '--'. Example: python -m tfdist.launch --ps 1 "
                         "--workers 2 -- python -m tfdist.train digits_mlp "
                         "--strategy parameter_server")
        if args.cpu_bind != "none":
            parser.error(f"--cpu-bind applies to -n and --hosts workers, not to a "
                         f"parameter-server cluster. Received: --cpu-bind {args.cpu_bind} "
                         f"with --ps {args.ps}.")
        return run_ps(args.workers, args.ps, command, args.timeout, log_dir=args.log_dir,
                      hosts=hosts)
    if args.num_workers is None:
        parser.error("give -n N, --hosts H:S,..., or --ps N --workers M.")
    if args.num_workers < 1:
        parser.error(f"-n must be >= 1. Received: {args.num_workers}.")
    if not command:
        parser.error("no COMMAND given after '--'. Example: python -m tfdist.launch -n 2 -- "
                     "python -m tfdist.train digits_mlp --strategy multi_worker")
    if args.min_workers is not None:
        if not 1 <= args.min_workers <= args.num_workers:
            given = f"--hosts {args.hosts}" if hosts is not None else f"-n {args.num_workers}"
            parser.error(f"--min-workers must be in [1, the number of workers]. Received: "
                         f"--min-workers {args.min_workers} with {given}.")
    return run(args.num_workers, command, args.timeout, max_restarts=args.max_restarts,
               log_dir=args.log_dir, hosts=hosts, min_workers=args.min_workers,
               cpu_bind=args.cpu_bind)


if __name__ == "__main__":
    sys.exit(main())
