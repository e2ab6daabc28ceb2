"""Supervising the launcher's processes: one job's tasks, started, watched and stopped.

`_TaskGroup` spawns each task with its TF_CONFIG (here, or on a host through
`placement._Remote`), prefixes its output (`_pump`), forwards SIGINT and
SIGTERM to it, and stops every task on exit (`_stop`: SIGTERM, then SIGKILL
after a grace). Each local child is tied to the launcher between fork and
exec (`_child_setup`: PR_SET_PDEATHSIG, default signal handlers, its share of
the cores). Imports no TensorFlow.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

from tfdist.launch.plan import log_file_name

if TYPE_CHECKING:
    from tfdist.launch.placement import _Remote


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
    # Its own process group: a terminal's Ctrl-C reaches the launcher alone, which
    # forwards it once. In the terminal's group a worker got it twice, the second
    # time when the launcher's forward came, which under load could be more than
    # `preemption.SECOND_INTERRUPT_AFTER_S` later and read as "stop now, unsaved".
    os.setpgid(0, 0)
    if cpus:  # --cpu-bind cores: inherited by every thread the worker starts
        os.sched_setaffinity(0, cpus)


# A worker this young may not have reached `tfdist.preemption.catch_signals` (its
# Python still starting): a signal then would have its default action (SIGTERM:
# death, 143, no status). Forwarding waits until the worker blocks or catches it.
YOUNG_S = 5.0


def _takes(pid: int, signum: int) -> bool:
    """Whether process `pid` blocks (or, SIGTERM, catches) `signum`; True if unknown.

    Read from /proc/PID/status. Python catches SIGINT from its start (to raise
    KeyboardInterrupt, wherever the main thread is), so for SIGINT only a block
    (tfdist's) counts.
    """
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return True
    bit = 1 << (signum - 1)
    masks = [fields.get(k, "").strip()
             for k in (("SigBlk",) if signum == signal.SIGINT else ("SigBlk", "SigCgt"))]
    return not all(masks) or any(int(m, 16) & bit for m in masks)


def _deliver(p, signum: int, started: float) -> None:
    """Sends `signum` to `p` once it takes it, or when it is `YOUNG_S` old.

    Only for a worker of the launcher's own host (a remote one's pid is ssh's).
    """
    pid = p.pid
    while (p.poll() is None
           and time.monotonic() - started < YOUNG_S and not _takes(pid, signum)):
        time.sleep(0.02)
    if p.poll() is None:
        p.send_signal(signum)


ERROR_PREFIX = b"error: "  # how tfdist.train starts the one line of a refused run


class _Errors:
    """The error lines the tasks printed, each passed on once.

    Every task of a job checks the same command line before TensorFlow starts,
    so a refused option is refused by each of them in the same words: the
    launcher shows that line once (from the first task that said it), not once
    per task. Each task's log file (`--log-dir`) still has its own.
    """

    def __init__(self):
        self._seen: set[bytes] = set()
        self._lock = threading.Lock()

    def first(self, line: bytes) -> bool:
        """Whether `line` is to be shown: not an error line, or the first of its text."""
        if not line.startswith(ERROR_PREFIX):
            return True
        with self._lock:
            new = line not in self._seen
            self._seen.add(line)
            return new

    @property
    def any(self) -> bool:
        """Whether some task printed an error line."""
        return bool(self._seen)


def _pump(stream, prefix: str, out, log=None, lock=None, errors=None) -> None:
    for line in iter(stream.readline, b""):
        if errors is None or errors.first(line):
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
        self.procs, self._pumps, self._logs, self._started = [], [], [], []
        self.errors = _Errors()  # the tasks' error lines, shown once each
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
            # A remote worker's pid here is ssh's: it is forwarded to at once.
            self._started.append(time.monotonic() if not (on and on[0] is not None) else None)
            for stream, out, errors in ((p.stdout, sys.stdout, None),
                                        (p.stderr, sys.stderr, self.errors)):
                t = threading.Thread(target=_pump, args=(stream, f"[{label}] ", out, log, lock,
                                                         errors), daemon=True)
                t.start()
                self._pumps.append(t)

    def said_why(self, index: int, wait_s: float = 2.0) -> bool:
        """Whether a task printed an error line, once task `index` (ended) has been read out."""
        for t in self._pumps[2 * index:2 * index + 2]:
            t.join(timeout=wait_s)
        return self.errors.any

    def _forward(self, signum, _frame):
        if self.signalled is not None:
            self.forced = True  # a second Ctrl-C: stop now, do not wait for saves
        else:
            self.signalled, self.signalled_at = signum, time.monotonic()
        for p, started in zip(self.procs, self._started):
            if p.poll() is None:
                if started is not None and time.monotonic() - started < YOUNG_S:
                    threading.Thread(target=_deliver, args=(p, signum, started),
                                     daemon=True).start()
                else:
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
