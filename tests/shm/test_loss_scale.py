"""mixed_float16 with one replica per process: every rank skips an overflowing step together."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.conftest import WORKERS, run_py, tail

pytestmark = pytest.mark.integration
WORKER = os.path.join(WORKERS, "shm_loss_scale.py")


def _run(mode, out):
    os.makedirs(out)
    return run_py(["-m", "tfdist.launch", "-n", "2", "--timeout", "120", "--", "python",
                   WORKER, mode, out], timeout=180)


def test_ranks_agree_to_skip_when_one_overflows(tmp_path):
    proc = _run("tfdist", str(tmp_path / "agree"))
    assert proc.returncode == 0, tail(proc)
    r0, r1 = (dict(np.load(tmp_path / "agree" / f"rank{r}.npz")) for r in (0, 1))
    # Rank 1's batch 2 overflowed: both halved the scale and skipped that update.
    assert float(r0["scale"]) == float(r1["scale"]) == 2.0 ** 14
    assert int(r0["iterations"]) == int(r1["iterations"]) == 2
    assert str(r0["lso_class"]) == "keras.src.optimizers.loss_scale_optimizer.LossScaleOptimizer"
    for i in range(2):
        np.testing.assert_array_equal(r0[f"w{i}"], r1[f"w{i}"])
        assert np.all(np.isfinite(r0[f"w{i}"]))


def test_keras_loss_scaling_alone_lets_ranks_fall_out_of_step(tmp_path):
    # Upstream behaviour: rank 0 applies step 2 (and all-reduces), rank 1 skips
    # it; rank 0's third all-reduce then has no partner.
    proc = _run("keras", str(tmp_path / "keras"))
    assert proc.returncode != 0
    assert "rank 1 exited" in proc.stdout + proc.stderr, tail(proc)
