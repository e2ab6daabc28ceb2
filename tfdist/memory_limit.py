"""How much memory this process holds and may still take, read from /proc and its cgroup.

Pure reads of text files (no TensorFlow): the final save (`final_weights`)
and the pipeline's planner (`model_parallel.planning.auto`) both ask.
"""

from __future__ import annotations


def headroom_bytes() -> int | None:
    """Memory this process may still take: its memory cgroup's limit (v1 or v2) less
    its resident set, else the machine's available memory; None when unknown."""
    rss = _proc_kb("/proc/self/status", "VmRSS")
    limit = _cgroup_limit()
    if limit is not None and rss is not None:
        return max(0, limit - rss * 1024)
    available = _proc_kb("/proc/meminfo", "MemAvailable")
    return None if available is None else available * 1024


def rss_bytes() -> int | None:
    """This process's resident set in bytes (None: unknown)."""
    rss = _proc_kb("/proc/self/status", "VmRSS")
    return None if rss is None else rss * 1024


def _proc_kb(path: str, key: str) -> int | None:
    """A "Key: N kB" line of a /proc file (/proc/self/status, /proc/meminfo), in kB."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _cgroup_limit() -> int | None:
    """This process's memory cgroup limit in bytes (None: none set)."""
    try:
        with open("/proc/self/cgroup", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2
            candidates = [f"/sys/fs/cgroup{path}/memory.max"]
        elif "memory" in controllers.split(","):
            candidates = [f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"]
        else:
            continue
        for name in candidates:
            try:
                with open(name, encoding="ascii") as f:
                    text = f.read().strip()
            except OSError:
                continue
            if text.isdigit() and int(text) < 2**60:
                return int(text)
    return None
