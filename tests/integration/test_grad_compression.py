"""--grad-compression: gradients cast for the all-reduce train within a tolerance of uncompressed.

digits_mlp, 2 epochs of deterministic SGD (tests/integration/test_data_parallel.py's
setup). Each compressed run must differ from the uncompressed one (the casts
happened) by no more than the stated tolerance, and its workers must agree.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import run_py
from tests.integration.test_data_parallel import COMMON, _train, _weights, multi_worker_run

pytestmark = pytest.mark.integration
FP16_ATOL = 1e-3   # the bound for fp16 under multi_worker
BF16_ATOL = 2e-2   # bfloat16 keeps 8 mantissa bits to float16's 11


def _max_diff(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(_weights(a), _weights(b)))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shared_run):
    tmp = str(tmp_path_factory.mktemp("gc"))
    return {
        # Uncompressed: test_data_parallel's run, trained once for both modules.
        "mw": shared_run(multi_worker_run),
        "mw_fp16": _train(tmp, "mwfp16", ["--strategy", "multi_worker",
                                          "--grad-compression", "fp16"], launch_n=2),
        "mirrored_bf16": _train(tmp, "mbf16", ["--strategy", "mirrored", "--devices", "2",
                                               "--grad-compression", "bf16"]),
        "shm_fp16": _train(tmp, "shmfp16", ["--strategy", "shm", "--grad-compression", "fp16"],
                           launch_n=2),
    }


def test_multi_worker_fp16_within_1e3_of_uncompressed(runs):
    (w0, w1), _, _ = runs["mw"]
    (c0, c1), _, _ = runs["mw_fp16"]
    diff = _max_diff(c0, w0)
    assert 0 < diff < FP16_ATOL, diff
    assert _max_diff(c0, c1) == 0  # every worker applied the same reduced gradients


def test_mirrored_bf16_within_tolerance(runs):
    (w0, _), _, _ = runs["mw"]  # multi_worker equals mirrored uncompressed (test_data_parallel)
    (m,), _, _ = runs["mirrored_bf16"]
    diff = _max_diff(m, w0)
    assert 0 < diff < BF16_ATOL, diff


def test_shm_fp16_within_1e3_of_uncompressed(runs):
    (w0, _), _, _ = runs["mw"]
    (s0, s1), _, _ = runs["shm_fp16"]
    diff = _max_diff(s0, w0)
    assert 0 < diff < FP16_ATOL, diff
    assert _max_diff(s0, s1) == 0


def test_unknown_compression_is_refused_before_tensorflow(tmp_path):
    proc = run_py(["-m", "tfdist.train", *COMMON, "--grad-compression", "int8",
                   "--model-dir", str(tmp_path / "m")], timeout=60)
    assert proc.returncode == 2
    assert "--grad-compression must be one of none, fp16, bf16" in proc.stderr
    assert "'int8'" in proc.stderr
    assert "tensorflow" not in proc.stderr.lower()


def test_compression_without_an_all_reduce_is_refused(tmp_path):
    proc = run_py(["-m", "tfdist.train", *COMMON, "--strategy", "pipeline",
                   "--grad-compression", "fp16", "--model-dir", str(tmp_path / "m")], timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "--grad-compression applies only to --strategy mirrored, multi_worker, horovod, shm" \
        in proc.stderr
