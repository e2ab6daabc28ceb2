"""tfdist.collectives on the shared-memory engine: 2 real ranks (tests/workers/collectives_checks.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import WORKERS, clean_env
from tfdist.launch import free_ports

pytestmark = pytest.mark.integration

WORKER = os.path.join(WORKERS, "collectives_checks.py")
CHECKS = ["broadcast", "average", "any_and_all_agreement", "barrier_waits_for_the_last_rank",
          "broadcast_initial_state_callback", "metric_average_callback",
          "metric_average_refuses_different_names_on_every_rank"]


def _ranks(engine, size=2):
    port = free_ports(1)[0]
    procs = [subprocess.Popen([sys.executable, WORKER, engine, str(r), str(size), str(port)],
                              env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for r in range(size)]
    outs = [p.communicate(timeout=180)[0] for p in procs]
    return procs, outs


def test_shm_collectives_and_the_callbacks_written_once_on_them():
    procs, outs = _ranks("shm")
    for rank, (proc, out) in enumerate(zip(procs, outs)):
        assert proc.returncode == 0 and "FAIL" not in out, out[-4000:]
        for name in CHECKS:
            assert f"CHECK {name} ok rank={rank}" in out, (name, out[-4000:])


def test_shm_lost_peer_is_structured_not_text():
    procs, outs = _ranks("shm-die")
    assert procs[0].returncode == 0, outs[0][-3000:]
    # Raised as PeerLostError with the rank as a field; and kept by the engine for
    # the trainer, whose TensorFlow error (from inside a numpy_function) names nobody.
    assert "RAISED PeerLostError rank=1" in outs[0], outs[0][-3000:]
    assert "LOST rank=1 address=None" in outs[0], outs[0][-3000:]
