"""`--shard-optimizer-state` under Horovod: 2 Gloo ranks, each holding half the
optimizer state, end with one replica's weights.

The same cells as tests/integration/test_zero.py (dense and Embedding +
attention models, SGD + momentum, Adam, AdamW and RMSprop, and Adam with 2
accumulated half batches), trained by `horovodrun --gloo` in the Horovod venv
(TensorFlow 2.18), against one replica in the same venv.
"""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest

from tests.conftest import REPO, clean_env, tail
from tests.integration.test_equality_matrix import _assert_equal_weights, _load
from tests.integration.test_horovod import horovodrun, venv  # noqa: F401 (venv: a fixture)
from tests.integration.test_zero import MODELS, OPTIMIZERS, SLOTS_PER_WEIGHT, VARIANTS, WORKER

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def horovod(tmp_path_factory, venv):
    """(reference cells, {worker: cells}) of one replica and 2 sharded Gloo ranks."""
    python = os.path.join(venv, "bin", "python")
    tmp = tmp_path_factory.mktemp("zero_hvd")
    common = ["--models", MODELS, "--optimizers", ",".join(OPTIMIZERS)]
    single = subprocess.Popen([python, WORKER, "single", str(tmp / "single"), *common],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=REPO, env=clean_env(PYTHONPATH=REPO))
    ranks = horovodrun(venv, 2, "gloo", [WORKER, "horovod", str(tmp / "ranks"), *common,
                                                 "--variants", VARIANTS,
                                                 "--shard-optimizer-state"], timeout=450)
    out, err = single.communicate(timeout=450)
    assert single.returncode == 0, (out + err)[-3000:]
    assert ranks.returncode == 0, tail(ranks)
    return _load(str(tmp / "single"))["worker0"], _load(str(tmp / "ranks"))


def test_sharded_horovod_ranks_equal_one_replica_and_hold_half_the_state(horovod):
    reference, workers = horovod
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
    for optimizer in OPTIMIZERS:
        states = [json.loads(w[f"state:dense+attention-{optimizer}"]) for w in workers.values()]
        slots = [s["slot_bytes"] for s in states]
        total = SLOTS_PER_WEIGHT[optimizer] * states[0]["weight_bytes"]
        assert sum(slots) == total and min(slots) > 0, (optimizer, slots, total)
        assert max(slots) <= total / 2 + SLOTS_PER_WEIGHT[optimizer] * states[0]["largest"]
