"""Sharding under Horovod: 2 Gloo ranks at `--shard gradients`, each holding half the
optimizer state, reduced gradients and accumulators, and at `--shard parameters`,
each holding its rows of every weight (`hvd.allgather` before a layer runs, again in
its backward pass, and `hvd.reducescatter` of its gradients), end with one
replica's weights (one horovodrun trains both levels in turn).

The same cells as tests/integration/test_zero.py (dense and Embedding +
attention models, SGD + momentum, Adam, AdamW and RMSprop, Adam with 2
accumulated half batches, SGD clipped by global norm), trained by `horovodrun
--gloo` in the Horovod venv (TensorFlow 2.18) with `hvd.reducescatter`, against
one replica in the same venv; and the backup of ranks at `--shard optimizer`
(each rank's slots in a part of its own) resumed on one replica without sharding.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from tests.conftest import REPO, clean_env, tail
from tests.integration.test_equality_matrix import _assert_equal_weights, _load
from tests.integration.test_horovod import _train, horovodrun, venv  # noqa: F401 (a fixture)
from tests.integration.test_zero import (CLIPPED, MODELS, OPTIMIZERS, SLOTS_PER_WEIGHT,
                                         VARIANTS, WORKER)
from tests.weights import dump_weights

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def horovod(tmp_path_factory, venv):
    """(reference cells, {worker: cells}) of one replica and 2 sharded Gloo ranks."""
    python = os.path.join(venv, "bin", "python")
    tmp = tmp_path_factory.mktemp("zero_hvd")
    common = ["--models", MODELS, "--optimizers", ",".join(OPTIMIZERS)]
    single = subprocess.Popen([python, WORKER, "single", str(tmp / "single"), *common,
                               "--variants", CLIPPED],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=REPO, env=clean_env(PYTHONPATH=REPO))
    ranks = horovodrun(venv, 2, "gloo", [WORKER, "horovod", str(tmp / "ranks"), *common,
                                                 "--variants", VARIANTS,
                                                 "--shard", "gradients,parameters"],
                       timeout=450)
    out, err = single.communicate(timeout=450)
    assert single.returncode == 0, (out + err)[-3000:]
    assert ranks.returncode == 0, tail(ranks)
    return (_load(str(tmp / "single"))["worker0"], _load(str(tmp / "ranks-gradients")),
            _load(str(tmp / "ranks-parameters")))


def test_sharded_horovod_ranks_equal_one_replica_and_hold_half_the_state(horovod):
    reference, workers, _ = horovod
    assert len(workers) == 2
    cells = workers["worker0"]
    for model in MODELS.split(","):
        for optimizer in OPTIMIZERS:
            cell = f"{model}-{optimizer}"
            _assert_equal_weights(cells[cell], reference[cell], cell=f"horovod {cell}")
            for key, value in cells[cell].items():  # both ranks got the owners' values
                np.testing.assert_array_equal(workers["worker1"][cell][key], value, err_msg=cell)
    _assert_equal_weights(cells["attention-adam-acc2"], reference["attention-adam"],
                          cell="horovod attention-adam-acc2")
    clipped = CLIPPED.replace(":", "-")
    _assert_equal_weights(cells[clipped], reference[clipped], cell=f"horovod {clipped}")
    # The accumulators (one weight's worth) are split with Adam's 2 moments.
    acc = [json.loads(w["state:attention-adam-acc2"]) for w in workers.values()]
    assert sum(s["slot_bytes"] for s in acc) == 3 * acc[0]["weight_bytes"], acc
    for optimizer in OPTIMIZERS:
        states = [json.loads(w[f"state:dense+attention-{optimizer}"]) for w in workers.values()]
        assert {s["level"] for s in states} == {"gradients"}, states
        slots = [s["slot_bytes"] for s in states]
        total = SLOTS_PER_WEIGHT[optimizer] * states[0]["weight_bytes"]
        assert sum(slots) == total and min(slots) > 0, (optimizer, slots, total)
        assert max(slots) <= total / 2 + SLOTS_PER_WEIGHT[optimizer] * states[0]["largest"]


def test_horovod_ranks_holding_rows_of_every_weight_equal_one_replica(horovod):
    from tests.integration.test_zero import _assert_each_holds_its_rows

    reference, _, workers = horovod
    assert len(workers) == 2
    cells = workers["worker0"]
    for cell in [f"{m}-{o}" for m in MODELS.split(",") for o in OPTIMIZERS] + [
            "attention-adam-acc2", CLIPPED.replace(":", "-")]:
        want = reference[cell.replace("-acc2", "")]
        _assert_equal_weights(cells[cell], want, cell=f"horovod parameters {cell}")
    for worker in workers.values():
        assert json.loads(worker["state:attention-sgd-clip"])["scattered"] is True
    _assert_each_holds_its_rows(workers, 2)


def test_a_sharded_horovod_backup_resumes_on_one_replica_unsharded(venv, tmp_path):
    """2 sharded Gloo ranks train an epoch of Adam; each writes its half of the slots
    beside rank 0's backup, and one replica without sharding resumes it for a second
    epoch to the weights of one replica's uninterrupted 2 epochs (rtol 1e-5)."""
    adam = ["--optimizer", "adam", "--learning-rate", "0.01"]
    tmp = str(tmp_path)
    _, sharded, _ = _train(venv, tmp, "sharded", 2, "gloo",
                           [*adam, "--epochs", "1", "--shard-optimizer-state"])
    backups = sorted(os.listdir(os.path.join(sharded, "backup")))
    assert [n for n in backups if ".slots-" in n] == [
        "ckpt-0000000022.npz.slots-0-of-2", "ckpt-0000000022.npz.slots-1-of-2"], backups
    os.makedirs(os.path.join(tmp, "resumed"))
    shutil.copytree(sharded, os.path.join(tmp, "resumed", "model"))
    (resumed,), _, proc = _train(venv, tmp, "resumed", extra=adam)
    assert "resumed from a 2-replica horovod backup on 1 replica" in proc.stdout, tail(proc)
    (whole,), _, _ = _train(venv, tmp, "whole", extra=adam)
    got, want = dump_weights(resumed), dump_weights(whole)
    assert len(got) == len(want) == 4
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert not all(np.allclose(a, b) for a, b in zip(want, dump_weights(whole, "init")))
