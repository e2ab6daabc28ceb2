"""Runs one command inside a kernel memory cap of its own (a cgroup v1 memory group).

    python -m tfdist.bench.capped LIMIT_MIB [--report FILE] -- COMMAND ...

The command runs as a child in a new group under /sys/fs/cgroup/memory with
`memory.limit_in_bytes` (and the swap limit, where the kernel has one) set to
LIMIT_MIB, so going over it gets the process killed by the kernel, not slowed.
SIGTERM and SIGINT are passed on to the child; the child's pid is printed first
(a test SIGKILLs the child, not this wrapper). When it ends, the child's peak
RSS, the group's peak and its OOM kills are printed (and written as JSON to
--report, where "{task}" becomes the TF_CONFIG task index), the group is
removed, and the child's exit status is returned.
Needs root and a cgroup v1 memory hierarchy (both on these machines).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

ROOT = "/sys/fs/cgroup/memory"


def parse(argv: list[str]) -> tuple[int, str | None, list[str]]:
    """Pure function: (limit in bytes, report path, command) from the arguments."""
    if "--" not in argv:
        raise SystemExit("usage: python -m tfdist.bench.capped LIMIT_MIB [--report FILE] -- "
                         f"COMMAND ... Received: {argv}")
    head, command = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    report = None
    if "--report" in head:
        i = head.index("--report")
        report = head[i + 1]
        head = head[:i] + head[i + 2:]
    if len(head) != 1 or not command:
        raise SystemExit(f"capped takes one LIMIT_MIB and a command after --. Received: {argv}")
    return int(float(head[0]) * 2 ** 20), report, command


def _write(group: str, name: str, value) -> None:
    with open(os.path.join(group, name), "w") as f:
        f.write(str(value))


def _read(group: str, name: str) -> str:
    with open(os.path.join(group, name)) as f:
        return f.read()


def main(argv: list[str]) -> int:
    limit, report, command = parse(argv)
    group = os.path.join(ROOT, f"tfdist-capped-{os.getpid()}")
    os.makedirs(group)
    try:
        _write(group, "memory.limit_in_bytes", limit)
        if os.path.exists(os.path.join(group, "memory.memsw.limit_in_bytes")):
            _write(group, "memory.memsw.limit_in_bytes", limit)  # no escape into swap
        child = subprocess.Popen(command, preexec_fn=lambda: _write(group, "cgroup.procs", 0))
        print(f"capped: pid {child.pid} in {group}, limit {limit // 2 ** 20} MiB", flush=True)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda s, _f: child.send_signal(s))
        _, status, usage = os.wait4(child.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        oom = dict(line.split() for line in _read(group, "memory.oom_control").splitlines())
        out = {"limit_mib": limit / 2 ** 20, "exit": code,
               # The group's peak counts page cache (backups written), which the kernel
               # reclaims before it kills; the process's own peak is its VmHWM.
               "group_peak_mib": int(_read(group, "memory.max_usage_in_bytes")) / 2 ** 20,
               "rss_peak_mib": usage.ru_maxrss / 1024,
               "oom_kills": int(oom.get("oom_kill", 0))}
        print(f"capped: pid {child.pid} exit {code}, peak RSS {out['rss_peak_mib']:.0f} MiB "
              f"of {out['limit_mib']:.0f}, oom kills {out['oom_kills']}", flush=True)
        if report:
            task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0)
            with open(report.replace("{task}", str(task)), "w") as f:
                json.dump(out, f)
        return code if code >= 0 else 128 - code
    finally:
        _remove(group)


def _remove(group: str, timeout_s: float = 10.0) -> None:
    """Removes the group once it is empty: what the command left behind in it (the shm
    engine's multiprocessing resource tracker outlives its worker by a moment) is
    killed first, as the group cannot be removed while a process is in it."""
    import errno
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        for pid in _read(group, "cgroup.procs").split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.rmdir(group)
            return
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
