"""Process-shared POSIX semaphores in a shared segment, called through ctypes.

Why semaphores: a rank that waits for a slow peer must sleep in the kernel,
not poll (the peer may need the very core it would burn), and the data a
peer wrote before arriving must be visible once we see it arrive. POSIX
promises both for `sem_post`/`sem_wait` (they "synchronize memory with
respect to other threads", XBD 4.12) on every architecture; glibc's
implementation is an atomic counter with a futex, so a post nobody sleeps on
costs no system call.

`sem_trywait` and `sem_post` go through `ctypes.PyDLL`, keeping the GIL:
they never block, and letting go of the GIL on every poll would hand it to
any other Python thread for a whole switch interval (5 ms). `sem_timedwait`
goes through `ctypes.CDLL`, which releases the GIL while the rank sleeps.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time

SEM_BYTES = 64  # glibc's sem_t is 32 bytes; one cache line each avoids false sharing


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        nogil, gil = ctypes.CDLL(name, use_errno=True), ctypes.PyDLL(name)
        fns = {"init": gil.sem_init, "post": gil.sem_post, "trywait": gil.sem_trywait,
               "timedwait": nogil.sem_timedwait}
    except (OSError, AttributeError):
        return None
    for fn in fns.values():
        fn.restype = ctypes.c_int
    fns["init"].argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint]
    fns["post"].argtypes = fns["trywait"].argtypes = [ctypes.c_void_p]
    fns["timedwait"].argtypes = [ctypes.c_void_p, ctypes.POINTER(_Timespec)]
    return fns


_LIBC = _load()


def available() -> bool:
    """True when this platform's C library has process-shared POSIX semaphores."""
    return _LIBC is not None


def init(address: int) -> None:
    """Makes the SEM_BYTES at `address` (in a shared mapping) a process-shared semaphore at 0.

    Raises:
        OSError: when the C library refuses.
    """
    if _LIBC["init"](ctypes.c_void_p(address), 1, 0) != 0:
        raise OSError(ctypes.get_errno(), "sem_init failed")


def post(address: ctypes.c_void_p) -> None:
    """Adds one to the semaphore (a release: writes before it are seen after the wait)."""
    _LIBC["post"](address)


def try_wait(address: ctypes.c_void_p) -> bool:
    """Takes one if the semaphore is positive; never blocks."""
    return _LIBC["trywait"](address) == 0


def wait(address: ctypes.c_void_p, seconds: float) -> bool:
    """Takes one, sleeping (GIL released) up to `seconds`; False on timeout or signal."""
    deadline = time.time() + seconds  # sem_timedwait wants CLOCK_REALTIME
    ts = _Timespec(int(deadline), int((deadline % 1) * 1e9))
    return _LIBC["timedwait"](address, ctypes.byref(ts)) == 0
