"""tfdist.collectives on MultiWorkerMirrored: 2 real workers (tests/workers/collectives_checks.py).

The preemption agreement and the barrier the trainer uses under multi_worker
are these calls, and the broadcast that carries a worker's rows of a weight
at `--shard parameters`; here each is checked against values computed by hand. Then
the all-to-all `--shard-optimizer-state` sums gradients with
(`tfdist.compat.tf_all_to_all`), and the upstream gap it stands in for: the
reduce-scatter collective has no CPU implementation.
"""

from __future__ import annotations

import os
import sys

import pytest

from tests.conftest import WORKERS, run_py, tail

pytestmark = pytest.mark.integration

CHECKS = ["average", "any_and_all_agreement", "barrier_waits_for_the_last_rank",
          "broadcast_carries_the_roots_values", "all_to_all_sends_row_q_to_rank_q",
          "reduce_scatter_has_no_cpu_implementation"]


def test_mwms_average_agreement_and_barrier_on_two_workers():
    proc = run_py(["-m", "tfdist.launch", "-n", "2", "--timeout", "120", "--", sys.executable,
                   os.path.join(WORKERS, "collectives_checks.py"), "mwms"], timeout=180)
    assert proc.returncode == 0 and "FAIL" not in proc.stdout, tail(proc)
    for rank in (0, 1):
        for name in CHECKS:
            assert f"[worker {rank}] CHECK {name} ok rank={rank}" in proc.stdout, (name,
                                                                                   tail(proc))
