"""The C heap (glibc's malloc) under TensorFlow: large buffers back to the system when freed.

TensorFlow allocates tensors with `malloc`. glibc serves a request above its
mmap threshold with a mapping of its own, unmapped when freed, and anything
smaller from an arena, where freed pages stay resident. The threshold slides
up (to at most 32 MiB) each time a mapped buffer is freed, so after a few
training steps a 16 MiB tensor comes from an arena and, freed, stays in the
process's resident memory. Measured on the chief of 4 stage processes of
13 x 4096 + Adam (#40): over the final save's weights read from the other
stages its resident memory crept up about 90 MiB, and each 64 MiB weight read
peaked about 120 MiB above the level before it; with the threshold fixed at
4 MiB, nothing crept and a weight's read peaked at about its own size.

Pure ctypes; where there is no glibc (another C library, another system) every
function here does nothing and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_MMAP_THRESHOLD = -3  # mallopt's parameter (glibc's malloc.h)


@functools.lru_cache(maxsize=None)  # `trim` runs once a weight in a save
def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def map_above(nbytes: int) -> bool:
    """Fixes glibc's mmap threshold at `nbytes`: every later request above it is a
    mapping of its own, returned to the system when freed (the threshold no longer
    slides). Returns False where that cannot be done."""
    libc = _libc()
    return bool(libc is not None and libc.mallopt(M_MMAP_THRESHOLD, int(nbytes)) == 1)


def trim() -> bool:
    """Returns the arenas' free pages to the system (`malloc_trim(0)`); False where
    there is no glibc."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
