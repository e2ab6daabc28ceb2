"""A worker ends when the pipe its output goes to has no reader any more.

`tfdist.launch` reads each worker's stdout and stderr through pipes. If the
launcher dies (even by SIGKILL, which gives it no chance to stop anyone) those
pipes lose their reader. The launcher also asks the kernel to SIGKILL its
workers when it dies (PR_SET_PDEATHSIG); this is the second signal, and the
one that also works where that cannot (a worker started through `ssh`, whose
session's pipes close). Like SIGPIPE for a Unix program whose output pipe
closes, but without waiting for the next write, so a quiet worker
(`--verbose 0`) notices too. Output to a terminal or a file is never watched.
"""

from __future__ import annotations

import os
import select
import signal
import stat
import sys
import threading


def _is_pipe(fd: int) -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


def _wait_for_no_reader(fd: int) -> None:
    poller = select.poll()
    poller.register(fd, 0)  # no events asked: poll reports only POLLERR/POLLHUP
    while True:
        for _, event in poller.poll():
            if event & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
                # The same end as the launcher's PR_SET_PDEATHSIG gives.
                os.kill(os.getpid(), signal.SIGKILL)


def watch_output_pipes() -> list[int]:
    """Starts a daemon thread per stdout/stderr pipe; returns the fds watched."""
    fds = [f.fileno() for f in (sys.stdout, sys.stderr) if f is not None and _is_pipe(f.fileno())]
    for fd in fds:
        threading.Thread(target=_wait_for_no_reader, args=(fd,), daemon=True,
                         name=f"tfdist-lifeline-{fd}").start()
    return fds
