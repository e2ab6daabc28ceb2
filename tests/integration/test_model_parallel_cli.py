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
    # Balanced in parameters: hidden_0 (64 inputs: 2080) | hidden_1, hidden_2 (1056 each)
    # and logits (330).
    assert rows == {"hidden_0": "CPU:0", "hidden_1": "CPU:1", "hidden_2": "CPU:1",
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
    assert kind == "Functional"  # the recipe's own kind of model, unsplit
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


# The chain: a layer without weights between Embedding and Dense, and a Dropout.
EMBED_CHAIN = '''
DEFAULTS = {"epochs": 1, "global_batch_size": 32, "learning_rate": 0.05}


def build_model(cfg):
    import keras

    return keras.Sequential([keras.Input((8,), dtype="int32"),
                             keras.layers.Embedding(20, 8, name="embed"),
                             keras.layers.GlobalAveragePooling1D(name="pool"),
                             keras.layers.Dense(16, activation="relu", name="d1"),
                             keras.layers.Dropout(0.1, name="drop"),
                             keras.layers.Dense(3, name="out")], name="embed_chain")


def build_dataset(cfg, split):
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0 if split == "train" else 1)
    x = rng.integers(0, 20, size=(128, 8)).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, (x[:, 0] % 3).astype("int32")))


def compile_kwargs(cfg):
    import keras

    return {"loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}
'''
# A residual branch: cut where one tensor crosses, before the Add's block or after it.
RESIDUAL = EMBED_CHAIN.replace('''    return keras.Sequential([keras.Input((8,), dtype="int32"),
                             keras.layers.Embedding(20, 8, name="embed"),
                             keras.layers.GlobalAveragePooling1D(name="pool"),
                             keras.layers.Dense(16, activation="relu", name="d1"),
                             keras.layers.Dropout(0.1, name="drop"),
                             keras.layers.Dense(3, name="out")], name="embed_chain")''', '''    x = keras.Input((8,), dtype="int32")
    h = keras.layers.GlobalAveragePooling1D(name="pool")(keras.layers.Embedding(20, 8)(x))
    h = keras.layers.Add(name="res")([h, keras.layers.Dense(8, name="d1")(h)])
    return keras.Model(x, keras.layers.Dense(3, name="out")(h))''')


def test_weightless_layers_go_with_neighbours_residuals_stay_whole_bad_splits_one_line(tmp_path):
    chain, residual = tmp_path / "embed_chain.py", tmp_path / "residual.py"
    chain.write_text(EMBED_CHAIN)
    residual.write_text(RESIDUAL)
    proc = run_py(["-m", "tfdist.train", str(chain), "--strategy", "pipeline", "--devices", "2",
                   "--microbatches", "2", "--model-dir", str(tmp_path / "m")], timeout=120)
    assert proc.returncode == 0, tail(proc)
    rows = {line.split()[0]: line.split()[1] for line in proc.stdout.splitlines()
            if line.split() and line.split()[0] in ("embed", "pool", "d1", "drop", "out")}
    # Balanced in parameters: embed (160) | d1 (144) and out (51), not the layers 2 | 1.
    assert rows == {"embed": "CPU:0", "pool": "CPU:0", "d1": "CPU:1", "drop": "CPU:1",
                    "out": "CPU:1"}, proc.stdout
    assert "WARNING" not in proc.stderr, proc.stderr  # no gradient asked of integer tokens
    proc = run_py(["-m", "tfdist.train", str(residual), "--strategy", "model_parallel",
                   "--devices", "2", "--model-dir", str(tmp_path / "r")], timeout=120)
    assert proc.returncode == 0, tail(proc)  # the residual block stays whole on one stage
    rows = {line.split()[0]: line.split()[1] for line in proc.stdout.splitlines()
            if line.split() and line.split()[0] in ("pool", "d1", "res", "out")}
    # The block (d1 and its Add) whole on stage 1: the embedding's 160 parameters against
    # its and out's 99.
    assert rows == {"pool": "CPU:0", "d1": "CPU:1", "res": "CPU:1", "out": "CPU:1"}, rows
    # More stages than places to cut: one line before the first step, exit 2.
    proc = run_py(["-m", "tfdist.train", str(residual), "--strategy", "model_parallel",
                   "--devices", "4", "--model-dir", str(tmp_path / "r4")], timeout=120)
    assert proc.returncode == 2, tail(proc)
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "Cannot split model into 4 stages" in errors[0] and "--devices" in errors[0], errors
    assert not (tmp_path / "r4" / "model.keras").exists()


def test_one_process_strategy_under_the_launcher_is_refused_by_every_worker(tmp_path):
    proc = run_py(["-m", "tfdist.launch", "-n", "2", "--", "python", "-m", "tfdist.train",
                   "digits_mlp", "--strategy", "mirrored", "--model-dir", str(tmp_path / "m")],
                  timeout=60)
    assert proc.returncode == 2, tail(proc)
    refusals = [line for line in (proc.stdout + proc.stderr).splitlines()
                if "--strategy mirrored trains in one process" in line]
    assert refusals and all("one of 2 tasks started by tfdist.launch (TF_CONFIG)" in line
                            and "(multi_worker, shm)" in line for line in refusals), refusals
    assert not (tmp_path / "m").exists()  # refused before anything was written
