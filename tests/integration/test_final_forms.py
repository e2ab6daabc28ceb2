"""#48: every --final-weights form, for each model kind, with real processes.

Own recipes (a Sequential and a Functional one, written here) and digits_mlp,
trained with `--final-weights sharded` under single, mirrored and shm x2: each
run's model.json + model.weights.json load with Keras alone and equal the
weights of its last backup. Then the rerun rule on a finished run: another
--final-weights form is written from the last backup (no training), a memory
option (--threads) is said to have nothing to act on; and `python -m tfdist.export` of the
Sequential run loads with Keras and equals its model.keras.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from tests.conftest import run_py, tail

pytestmark = pytest.mark.integration

RECIPE = '''
DEFAULTS = dict(epochs=1, global_batch_size=32, learning_rate=0.1, num_examples=256)


def build_model(cfg):
    import keras

    {body}


def build_dataset(cfg, split):
    import numpy as np
    import tensorflow as tf

    n = cfg["num_examples"] if split == "train" else 64
    rng = np.random.default_rng(0 if split == "train" else 1)
    x = rng.normal(size=(n, 8)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, (x[:, 0] > 0).astype("int32")))


def compile_kwargs(cfg):
    import keras

    return dict(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
'''
SEQUENTIAL = ('return keras.Sequential([keras.Input((8,)), keras.layers.Dense(6, '
              'activation="relu"), keras.layers.Dense(2)], name="my_seq")')
FUNCTIONAL = ('inputs = keras.Input((8,))\n    h = keras.layers.Dense(6, activation="relu")(inputs)'
              '\n    return keras.Model(inputs, keras.layers.Dense(2)(h), name="my_func")')


def _train(cwd, *args, n=0):
    launch = ["-m", "tfdist.launch", "-n", str(n), "--", sys.executable] if n else []
    return run_py([*launch, "-m", "tfdist.train", *args, "--threads", "1"], cwd=cwd,
                  timeout=300)


def _sharded(run_dir):
    import keras

    with open(os.path.join(run_dir, "model.json"), encoding="utf-8") as f:
        model = keras.models.model_from_json(f.read())
    model.load_weights(os.path.join(run_dir, "model.weights.json"))
    return [v.numpy() for v in model.weights]


def _backup(run_dir):
    """The newest backup's model weights, in the trained model's order."""
    from tfdist.checkpoint import BackupStore, backup_paths

    meta, arrays = BackupStore.load(backup_paths(os.path.join(run_dir, "backup"))[-1])
    return [arrays[f"model_{i}"] for i in range(len(meta["model_signature"]))]


def _equal(got, want):
    assert len(got) == len(want) > 0
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_final_weights_forms_of_each_model_kind_and_the_rerun_rule(tmp_path):
    cwd = str(tmp_path)
    (tmp_path / "my_seq.py").write_text(RECIPE.format(body=SEQUENTIAL))
    (tmp_path / "my_func.py").write_text(RECIPE.format(body=FUNCTIONAL))
    runs = {"my_seq": (["my_seq"], 0, "runs/my_seq/single"),
            "digits_mlp": (["digits_mlp", "--strategy", "mirrored", "--devices", "2",
                            "--epochs", "1", "--steps-per-epoch", "4"], 0,
                           "runs/digits_mlp/mirrored-2dev"),
            "my_func": (["my_func", "--strategy", "shm"], 2, "runs/my_func/shm-2w")}
    from concurrent.futures import ThreadPoolExecutor

    # The two one-process runs side by side (one thread each: a core each), then shm x2.
    with ThreadPoolExecutor(2) as pool:
        procs = list(pool.map(lambda job: _train(cwd, *job[0], "--final-weights", "sharded",
                                                 n=job[1]), list(runs.values())[:2]))
    procs.append(_train(cwd, *runs["my_func"][0], "--final-weights", "sharded", n=2))
    for (name, (args, n, run_dir)), proc in zip(runs.items(), procs):
        assert proc.returncode == 0, f"{name}\n{tail(proc)}"
        assert "model.weights.json (sharded weights)" in proc.stdout, tail(proc)
        run_dir = os.path.join(cwd, run_dir)
        assert "model.keras" not in os.listdir(run_dir)
        _equal(_sharded(run_dir), _backup(run_dir))  # Keras alone; the backup's weights

    # Another output form on a finished run: written from its last backup, no training.
    seq = os.path.join(cwd, "runs/my_seq/single")
    proc = _train(cwd, "my_seq", "--final-weights", "keras")
    assert proc.returncode == 0, tail(proc)
    assert ("runs/my_seq/single already finished (1 epochs), nothing to train; writing the "
            "--final-weights keras form it lacks. --threads acts only while a run trains: "
            "not used.") in proc.stdout, tail(proc)  # a memory option: nothing to act on
    assert "resumed" not in proc.stdout  # nothing trained or evaluated
    assert sorted(n for n in os.listdir(seq) if n.startswith("model")) == ["model.keras"]
    import keras

    model = keras.models.load_model(os.path.join(seq, "model.keras"))
    _equal([v.numpy() for v in model.weights], _backup(seq))

    # tfdist.export of the Sequential run: Keras loads it, and it equals model.keras.
    proc = run_py(["-m", "tfdist.export", "runs/my_seq/single"], cwd=cwd)
    assert proc.returncode == 0, tail(proc)
    _equal(_sharded(os.path.join(seq, "export")), [v.numpy() for v in model.weights])
