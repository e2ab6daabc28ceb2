"""Real processes: `python -m tfdist.train` with --strategy model_parallel / pipeline.

The pipeline run (2 stages, 4 micro-batches) and the model-parallel run (a
hand-written --placement) end with the same weights as the unsplit run, print
the placement table read from the variables, and write a model.keras that
loads as a plain Keras model with those weights.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.conftest import WORKERS, override, run_py, tail

pytestmark = pytest.mark.integration

COMMON = ["model_parallel_mlp", "--epochs", "2", "--seed", "0", "--deterministic",
          "--hidden-units", "32", "--verbose", "0"]  # the recipe's default: --devices 2
PLACEMENT = "hidden_0=/cpu:1;hidden_1,hidden_2,logits=/cpu:0"


def _train(tmp, name, extra):
    dump, model_dir = os.path.join(tmp, name, "dump"), os.path.join(tmp, name, "model")
    proc = run_py([os.path.join(WORKERS, "train_dump.py"), dump,
                   *override(COMMON, "--model-dir", model_dir, *extra)])
    assert proc.returncode == 0, tail(proc)
    d = dict(np.load(os.path.join(dump, "worker0.npz")))
    return [d[f"w{i}"] for i in range(8)], model_dir, proc


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("mpcli"))
    return {"single": _train(tmp, "single", ["--strategy", "single"]),
            "pipeline": _train(tmp, "pipeline", ["--strategy", "pipeline", "--microbatches", "4"]),
            "placed": _train(tmp, "placed", ["--strategy", "model_parallel",
                                             "--placement", PLACEMENT])}


@pytest.mark.parametrize("name", ["pipeline", "placed"])
def test_split_cli_run_equals_single(runs, name):
    single, _, _ = runs["single"]
    split, _, _ = runs[name]
    for a, b in zip(split, single):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_placement_table_and_bubble_are_printed(runs):
    out = runs["pipeline"][2].stdout
    assert "strategy=pipeline" in out and "theoretical bubble 0.200" in out
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()
            if line.startswith(("hidden_", "logits"))}
    assert rows == {"hidden_0": "CPU:0", "hidden_1": "CPU:0", "hidden_2": "CPU:1",
                    "logits": "CPU:1"}
    placed = runs["placed"][2].stdout
    rows = {line.split()[0]: line.split()[1] for line in placed.splitlines()
            if line.startswith(("hidden_", "logits"))}
    assert rows == {"hidden_0": "CPU:1", "hidden_1": "CPU:0", "hidden_2": "CPU:0",
                    "logits": "CPU:0"}


def test_model_keras_loads_unsplit_with_the_trained_weights(runs):
    weights, model_dir, _ = runs["pipeline"]
    path = os.path.join(model_dir, "model.keras")
    proc = run_py(["-c", "import sys, keras, numpy as np; m = keras.models.load_model(sys.argv[1]);"
                         "print(type(m).__name__, np.sum([np.abs(w).sum() for w in "
                         "m.get_weights()]))", path], timeout=120)
    assert proc.returncode == 0, tail(proc)
    kind, total = proc.stdout.split()[-2:]
    assert kind == "Sequential"
    assert float(total) == pytest.approx(sum(float(np.abs(w).sum()) for w in weights), rel=1e-6)


def test_missing_device_is_one_clear_error(tmp_path):
    proc = run_py(["-m", "tfdist.train", *COMMON, "--strategy", "model_parallel",
                   "--placement", "hidden_0,hidden_1=/cpu:0;hidden_2,logits=/cpu:7",
                   "--model-dir", str(tmp_path)], timeout=120)
    assert proc.returncode == 2, tail(proc)
    assert "error: Device '/cpu:7' does not exist. Logical devices here: ['CPU:0', 'CPU:1']" \
        in proc.stderr
    assert "Traceback" not in proc.stderr


def test_microbatches_must_divide_the_batch_before_tensorflow():
    proc = run_py(["-m", "tfdist.train", *COMMON, "--strategy", "pipeline", "--microbatches",
                   "5"], timeout=60)
    assert proc.returncode == 2, tail(proc)
    assert "global_batch_size=64 is not divisible by microbatches=5" in proc.stderr
