"""Per-process memory and CPU time of a benchmark's workers, from /proc (Linux; no TensorFlow).

A `Sampler` thread finds the worker processes a command started (its root
process, or the workers `tfdist.launch` forked, told apart by the task index
in their TF_CONFIG) and reads each one's /proc/PID/status and /proc/PID/stat
every `interval_s`: VmRSS (resident now), VmHWM (the kernel's own high-water
mark of VmRSS, so a peak between two samples is not missed, only one in the
last interval before the process ends), the CPU seconds it has used (user +
system, all threads) and the seconds its threads have spent runnable but
waiting for a core (/proc/PID/task/*/schedstat): on shared cores, time lost
to other processes (and to its own other threads), not to the work. Time stamps are `time.monotonic()`, the clock
behind `time.perf_counter()` on Linux, so they compare with the step times a
worker reports (`tfdist.bench.timing`).
"""

from __future__ import annotations

import json
import os
import threading
import time

MB = 1 << 20


def parse_status(text: str) -> dict[str, int]:
    """Pure function: the `Vm*` lines of a /proc/PID/status text, in bytes.

    Raises:
        ValueError: for a Vm line whose unit is not kB.
    """
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not (sep and key.startswith("Vm")):
            continue
        parts = value.split()
        if len(parts) != 2 or parts[1] != "kB":
            raise ValueError(f"a /proc status line 'Vm...: N kB' was expected. Received: {line!r}.")
        out[key] = int(parts[0]) * 1024
    return out


def parse_stat_cpu_s(text: str, ticks_per_s: int) -> float:
    """Pure function: user + system CPU seconds of a /proc/PID/stat text (all its threads).

    Args:
        text: The file's one line, "pid (comm) state ppid ... utime stime ...".
        ticks_per_s: `os.sysconf("SC_CLK_TCK")`.
    """
    # comm may hold spaces and parentheses: fields are counted after its last ")".
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / ticks_per_s


def parse_schedstat_wait_s(text: str) -> float:
    """Pure function: seconds a thread waited on a run queue, from its schedstat line.

    The line is "ns on cpu, ns waiting on a run queue, timeslices".
    """
    return int(text.split()[1]) / 1e9


def task_index(environ: bytes) -> int | None:
    """Pure function: the task index in a /proc/PID/environ's TF_CONFIG, else its
    HOROVOD_RANK (a `horovodrun --gloo` rank's), else None."""
    rank = None
    for entry in environ.split(b"\0"):
        if entry.startswith(b"TF_CONFIG="):
            return int(json.loads(entry[len(b"TF_CONFIG="):])["task"]["index"])
        if entry.startswith(b"HOROVOD_RANK="):
            rank = int(entry[len(b"HOROVOD_RANK="):])
    return rank


def peaks(samples: list[tuple], until: float | None = None) -> dict:
    """Pure function: a process's peaks from its (time, VmRSS, VmHWM, ...) samples.

    Args:
        samples: In time order.
        until: Only samples taken at or before this time (say, the end of
            training); None: all.

    Returns:
        {"hwm_bytes": the last VmHWM seen (the peak up to then),
         "rss_max_bytes": the largest VmRSS sampled, "samples": how many}.
    """
    kept = [s for s in samples if until is None or s[0] <= until]
    return {"hwm_bytes": max((s[2] for s in kept), default=0),
            "rss_max_bytes": max((s[1] for s in kept), default=0), "samples": len(kept)}


def between(samples: list[tuple], start: float, end: float, field: int = 3) -> float | None:
    """Pure function: how much the counter in `field` grew from `start` to `end`.

    The counter (3: CPU seconds, 4: run-queue wait seconds) is interpolated
    linearly between the samples around each time; None when the samples
    do not cover [start, end].
    """
    def at(t):
        for a, b in zip(samples, samples[1:]):
            if a[0] <= t <= b[0]:
                w = (t - a[0]) / (b[0] - a[0]) if b[0] > a[0] else 0.0
                return a[field] + w * (b[field] - a[field])
        return None

    lo, hi = at(start), at(end)
    return None if lo is None or hi is None else hi - lo


def _descendants(pid: int) -> list[int]:
    """The processes under `pid`, nearest first (one scan of /proc/*/stat)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        parents.setdefault(int(stat[stat.rindex(b")") + 2:].split()[1]), []).append(int(entry))
    out, level = [], [pid]
    while level:
        level = [child for parent in level for child in sorted(parents.get(parent, []))]
        out += level
    return out


def _read(path: str, mode: str = "r"):
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:  # the process has ended
        return None


def _wait_s(pid: int) -> float:
    """Run-queue wait of all of `pid`'s live threads, in seconds."""
    total = 0.0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return total
    for tid in tids:
        text = _read(f"/proc/{pid}/task/{tid}/schedstat")
        if text:
            total += parse_schedstat_wait_s(text)
    return total


class Sampler:
    """Samples the memory of the worker processes under `root_pid` until stopped.

    Args:
        root_pid: The process started (a worker itself, or `tfdist.launch`).
        tasks: Workers to find: 1 means the root itself; N > 1 the processes
            under the root, indexed by their TF_CONFIG task index (`tfdist.launch`'s
            children) or their HOROVOD_RANK (`horovodrun --gloo`'s ranks, a shell
            and a Horovod middleman below it); the nearest one of each index.
        interval_s: Seconds between samples.
    """

    def __init__(self, root_pid: int, tasks: int, interval_s: float = 0.1):
        self.root_pid, self.tasks, self.interval_s = root_pid, tasks, interval_s
        self.pids: dict[int, int] = {0: root_pid} if tasks == 1 else {}
        # (time, VmRSS, VmHWM, CPU s, run-queue wait s) per task
        self.samples: dict[int, list[tuple[float, int, int, float, float]]] = {}
        self._ticks = os.sysconf("SC_CLK_TCK")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _find(self) -> None:
        for pid in _descendants(self.root_pid):
            environ = _read(f"/proc/{pid}/environ", "rb")
            index = task_index(environ) if environ else None
            if index is not None:
                self.pids.setdefault(index, pid)

    def _loop(self) -> None:
        while not self._stop.is_set():
            if len(self.pids) < self.tasks:
                self._find()
            for index, pid in list(self.pids.items()):
                text, stat = _read(f"/proc/{pid}/status"), _read(f"/proc/{pid}/stat")
                if text is None or stat is None:
                    continue
                vm = parse_status(text)
                if "VmRSS" in vm:  # absent once the process is a zombie
                    self.samples.setdefault(index, []).append(
                        (time.monotonic(), vm["VmRSS"], vm["VmHWM"],
                         parse_stat_cpu_s(stat, self._ticks), _wait_s(pid)))
            self._stop.wait(self.interval_s)
