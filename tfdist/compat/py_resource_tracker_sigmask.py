"""Python's resource tracker unblocks SIGINT and SIGTERM in the thread that starts it.

Upstream: CPython 3.11 `Lib/multiprocessing/resource_tracker.py`,
`ResourceTracker.ensure_running`, blocks SIGINT and SIGTERM around spawning the
tracker process, then unblocks them (`SIG_UNBLOCK`) whatever the mask was
before. The first `shared_memory.SharedMemory` a process creates or attaches
starts the tracker, so a `shm` worker of `python -m tfdist.train`, which blocks
both signals first thing and takes them with `sigtimedwait`
(`tfdist.preemption`), had them unblocked from its segment on: Ctrl-C then
raised KeyboardInterrupt mid-step ("interrupted outside training; nothing new
saved", or a traceback out of a collective) instead of saving a backup at the
next agreed step and exiting 130.

`ensure_running()` starts the tracker and puts the mask back; a signal that
arrives while it is unblocked goes to the catcher's handler meanwhile, so it is
recorded, not lost and not a KeyboardInterrupt.
"""

from __future__ import annotations

UPSTREAM = ("CPython 3.11 multiprocessing/resource_tracker.py: ensure_running unblocks "
            "SIGINT and SIGTERM after spawning the tracker")


def ensure_running() -> None:
    """Starts Python's resource tracker (once per process), keeping this thread's signal
    mask as it was (see the module)."""
    import signal
    import threading
    from multiprocessing import resource_tracker

    from tfdist import preemption

    caught = preemption.current()
    if caught is None or threading.current_thread() is not threading.main_thread():
        resource_tracker.ensure_running()
        return
    signals = sorted(getattr(caught, "_signals", (signal.SIGINT, signal.SIGTERM)))
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])  # the mask, unchanged
    old = {s: signal.signal(s, caught._handle) for s in signals}
    try:
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        for s, handler in old.items():
            signal.signal(s, handler)
