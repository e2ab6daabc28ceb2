"""`tfdist.compat.py_resource_tracker_sigmask`: Python's resource tracker unblocks SIGINT
and SIGTERM in the thread that starts it, and tfdist starts it keeping them blocked.

Each check runs in a fresh interpreter (a process whose tracker already runs would not
show the upstream behaviour), after `tfdist.preemption.catch_signals()` as
`python -m tfdist.train` does first thing.
"""

from __future__ import annotations

import pytest

from tests.conftest import run_py, tail

pytestmark = pytest.mark.integration

SCRIPT = """
import signal, sys
from tfdist import preemption

def blocked():
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    return sorted(int(s) for s in (signal.SIGINT, signal.SIGTERM) if s in mask)

preemption.catch_signals()
assert blocked() == [2, 15], blocked()
if sys.argv[1] == "upstream":
    from multiprocessing import resource_tracker
    resource_tracker.ensure_running()
else:
    from tfdist.compat import py_resource_tracker_sigmask
    py_resource_tracker_sigmask.ensure_running()
from multiprocessing import shared_memory  # the shm engine's segment: the tracker is up now
segment = shared_memory.SharedMemory(create=True, size=64)
segment.close()
segment.unlink()
print("BLOCKED", blocked())
"""


def test_the_tracker_unblocks_the_signals_and_tfdist_keeps_them_blocked():
    upstream = run_py(["-c", SCRIPT, "upstream"], timeout=60)
    assert upstream.returncode == 0, tail(upstream)
    assert "BLOCKED []" in upstream.stdout, tail(upstream)  # Ctrl-C would be a KeyboardInterrupt
    kept = run_py(["-c", SCRIPT, "tfdist"], timeout=60)
    assert kept.returncode == 0, tail(kept)
    assert "BLOCKED [2, 15]" in kept.stdout, tail(kept)
