"""Keras 3 clips before the cross-replica all-reduce; tfdist moves the reduce first.

Real replicas (2 logical CPUs in a subprocess). With Keras as released each
replica clips its own gradient and gradient accumulation fails under
MirroredStrategy; with the workaround both give the one-device result.
"""

import json
import os

import pytest

from tests.conftest import WORKERS, run_py, tail


def _run(mode):
    proc = run_py([os.path.join(WORKERS, "clip_reduction.py"), mode], timeout=120)
    assert proc.returncode == 0, tail(proc)
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def results():
    return {mode: _run(mode) for mode in ("keras", "tfdist")}


def test_keras_clips_each_replica_before_reducing(results):
    # Each replica clips its local gradient to norm 1: [1, 0] + [0, 1] = [1, 1].
    assert results["keras"]["clipped"] == pytest.approx([-1.0, -1.0], abs=1e-6)


def test_tfdist_clips_the_reduced_gradient(results):
    # One device: [1.5, 2.0] has norm 2.5 -> clipped to [0.6, 0.8].
    assert results["tfdist"]["clipped"] == pytest.approx([-0.6, -0.8], abs=1e-6)


def test_accumulation_under_mirrored(results):
    err = results["keras"].get("accumulated_error", "")
    assert "`merge_call` called while defining a new graph" in err, results["keras"]
    # Two micro-steps of the same reduced gradient [1.5, 2.0], averaged, applied once.
    assert results["tfdist"]["accumulated"] == pytest.approx([-1.5, -2.0], abs=1e-6)
