"""The launcher's run loops: one job from its first start to its exit status.

`run` supervises synchronous workers (MWMS, shm): a failed worker stops the
others; `--max-restarts` relaunches them all, `--min-workers` goes on
without one that keeps failing or a host that stopped answering. `run_ps`
supervises a parameter-server cluster, whose job is the chief's. Both print
their causes to stderr and return the launcher's exit status. Imports no
TensorFlow.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from tfdist import exit_codes, remote
from tfdist.cluster.tf_config import JOB_WORKERS_VAR
from tfdist.launch.placement import _describe, _placed, _Remote
from tfdist.launch.plan import (core_sets, describe_exit, describe_outcome, job_status,
                                ps_tf_configs, worker_tf_configs)
from tfdist.launch.tasks import FAILED_GRACE_S, _TaskGroup

SIGNAL_GRACE_S = 60.0  # after forwarding SIGINT/SIGTERM: time for workers to agree and save


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
        tfdist status (2 config, 3 cluster, 4 peer lost, 75 preempted); 4 too
        when a worker died by a signal or its host was lost (`plan.job_status`);
        else 1; 124 on timeout; 130 after SIGINT. The cause is printed to stderr
        (a refusal that workers printed is not repeated).
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
                status = job_status(failed_code, bool(on[i])
                                    and failed_code == remote.SSH_FAILED)
                # Said now, not after the others are stopped: stopping an unreachable
                # host's worker takes FAILED_GRACE_S. A refused input (exit 2) whose
                # error line a worker printed needs no second line.
                if not (failed_code == exit_codes.CONFIG and group.signalled is None
                        and group.said_why(i)):
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
