"""Split training equals unsplit training, and each stage's variables and ops are on its device.

One subprocess (tests/workers/mp_equality.py) with 2 logical CPUs trains the same
chain MLP unsplit and as pipelines with M = 1 (naive model parallelism), 4 and 8,
and a tensor-parallel MLP block against its unsplit Dense pair; SGD, deterministic
ops, same seed and init.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from tests.conftest import WORKERS, run_py, tail

pytestmark = pytest.mark.integration
RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("mp"))
    proc = run_py([os.path.join(WORKERS, "mp_equality.py"), out], timeout=300)
    assert proc.returncode == 0, tail(proc)
    arrays = dict(np.load(os.path.join(out, "weights.npz")))
    report = json.load(open(os.path.join(out, "report.json")))
    return arrays, report


def _group(arrays, prefix):
    keys = sorted((k for k in arrays if k.startswith(prefix + "_")),
                  key=lambda k: int(k.rsplit("_", 1)[1]))
    return [arrays[k] for k in keys]


@pytest.mark.parametrize("m", ["pipeline1", "pipeline4", "pipeline8", "onefoneb4"])
def test_pipeline_equals_unsplit(worker, m):
    arrays, _ = worker
    unsplit, split, init = (_group(arrays, p) for p in ("unsplit", m, "init"))
    assert len(split) == len(unsplit) == 8
    for a, b in zip(split, unsplit):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)
    # Training moved the weights, so equality is not of two copies of the init.
    assert max(np.abs(a - b).max() for a, b in zip(unsplit, init)) > 1e-3


def test_tensor_parallel_equals_unsplit(worker):
    arrays, report = worker
    tp, dense = _group(arrays, "tp"), _group(arrays, "dense")
    assert [a.shape for a in tp] == [(16, 64), (64,), (64, 4), (4,)]
    for a, b in zip(tp, dense):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)
    devices = report["tp_variables"]
    assert devices["parallel_mlp/column/kernel_0"].endswith("CPU:0")
    assert devices["parallel_mlp/column/kernel_1"].endswith("CPU:1")
    assert devices["parallel_mlp/row/kernel_1"].endswith("CPU:1")
    assert report["tp_reloaded_equal"]


def test_variables_live_on_their_stage_device(worker):
    _, report = worker
    for path, device in report["variables"].items():
        expected = report["stages"][path.split("/")[0]][-1]  # "/cpu:1" -> "1"
        assert device.endswith(f"CPU:{expected}"), (path, device)
    assert {d[-5:] for d in report["variables"].values()} == {"CPU:0", "CPU:1"}
    table = {row[0]: row[1] for row in report["table"]}
    assert table == {"d0": "CPU:0", "d1": "CPU:0", "d2": "CPU:1", "out": "CPU:1"}


def test_forward_and_backward_matmuls_run_on_the_stage_device(worker):
    _, report = worker
    forward = backward = 0
    for name, device in report["matmuls"]:
        layer = next(re.sub(r"_\d+$", "", t) for t in name.split("/")
                     if re.sub(r"_\d+$", "", t) in report["stages"])
        expected = report["stages"][layer][-1]
        assert device.endswith(f"CPU:{expected}"), (name, device)
        backward += name.startswith("gradient_tape/")
        forward += not name.startswith("gradient_tape/")
    # 8 micro-batches x 4 layers forward; 2 gradient MatMuls per layer backward, except
    # the first layer's input gradient, which nothing needs.
    assert forward == 8 * 4 and backward >= 8 * 7


def test_split_model_saves_plain_reloads_unsplit_and_splits_back(worker):
    _, report = worker
    assert report["reloaded_class"] == "Functional" and report["reloaded_equal"]
    assert report["resplit_equal"]
    # Split again in the other order: the same weights now live on the other devices.
    assert report["resplit_variables"]["d0/kernel"].endswith("CPU:1")
    assert report["resplit_variables"]["out/kernel"].endswith("CPU:0")
