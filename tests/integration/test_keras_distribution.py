"""keras.io's distribution guide on TensorFlow, with `import tfdist`: real devices and processes.

tests/workers/keras_guide.py is the guide's script (functional d1/d2, Adam,
a tf.data dataset batched at 64, `fit`, op determinism). One process on 2
logical CPUs trains it on one device, under DataParallel and under
ModelParallel on a (1, 2) mesh, and is refused a layout no split can honour;
2 processes of `tfdist.launch` call `initialize()` and train under
DataParallel, then again with process 1's labels changed; 2 processes x 2
logical CPUs train under ModelParallel on a (2, 2) mesh (batch across
processes, model within); and digits_mlp, given a `distribution()` returning
a LayoutMap, trains under `tfdist.train` as `--tensor-parallel 2`. Every run ends
with one device's weights (rtol 1e-5: measured <= 1.2e-7 apart); with the
labels changed the two processes still agree (they train together).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.conftest import REPO, WORKERS, clean_env, run_py, run_py_many, tail

SCRIPT = os.path.join(WORKERS, "keras_guide.py")
# digits_mlp choosing its distribution in Keras's terms (hidden/logits: its Dense pair).
RECIPE_DISTRIBUTION = """

def distribution(cfg):
    import keras

    devices = keras.distribution.list_devices()
    mesh = keras.distribution.DeviceMesh((1, len(devices)), ["batch", "model"], devices)
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["hidden/kernel"] = (None, "model")
    layout_map["hidden/bias"] = ("model",)
    layout_map["logits/kernel"] = ("model", None)
    return layout_map
"""
pytestmark = pytest.mark.integration


def _weights(out, name):
    data = np.load(os.path.join(out, f"{name}.npz"))
    return [data[k] for k in data.files]


def _same(a, b):
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_the_guide_trains_to_one_devices_weights(tmp_path):
    local, procs, hybrid = tmp_path / "local", tmp_path / "processes", tmp_path / "hybrid"
    for d in (local, procs, hybrid):
        d.mkdir()
    recipe = tmp_path / "kd_digits.py"
    with open(os.path.join(REPO, "recipes", "digits_mlp.py"), encoding="utf-8") as f:
        recipe.write_text(f.read() + RECIPE_DISTRIBUTION)
    launch = ["-m", "tfdist.launch", "-n", "2", "--timeout", "200", "--", "python", SCRIPT]
    one, two, four, trained = run_py_many(
        [[SCRIPT, "local", str(local)], [*launch, "processes", str(procs)],
         [*launch, "hybrid", str(hybrid)],
         ["-m", "tfdist.train", str(recipe), "--devices", "2", "--epochs", "1",
          "--model-dir", str(tmp_path / "run")]],
        envs=[clean_env(TFDIST_DEVICES="2"), clean_env(TFDIST_DEVICES="1"),
              clean_env(TFDIST_DEVICES="2"), None])
    for proc in (one, two, four, trained):
        assert proc.returncode == 0, tail(proc)
    single = _weights(local, "single-0")

    report = json.loads((local / "report-0.json").read_text())
    assert report["devices"] == ["cpu:0", "cpu:1"]
    assert [d.split("/")[-1] for d in report["data_parallel_kernel_devices"]] == [
        "device:CPU:0", "device:CPU:1"]  # the kernel mirrored on both devices
    _same(single, _weights(local, "data_parallel-0"))
    _same(single, _weights(local, "model_parallel-0"))
    lines = one.stdout.splitlines()
    assert ("tfdist: keras.distribution.DataParallel -> mirrored over cpu:0, cpu:1, "
            "num_replicas=2, processes=1") in lines, one.stdout
    assert any(line.startswith("tfdist: keras.distribution.ModelParallel -> tensor parallel")
               and "d1/kernel (16, 32) split on axis 1: /device:CPU:0 [0:16], /device:CPU:1 "
               "[16:32]" in line for line in lines), one.stdout
    assert "'d1/kernel'" in report["refused"] and "('model', 'model')" in report["refused"]
    assert report["untouched"], "a refused layout must train nothing"

    for pid in (0, 1):
        _same(single, _weights(procs, f"processes-{pid}"))
    flipped = [_weights(procs, f"flipped-{pid}") for pid in (0, 1)]
    for a, b in zip(*flipped):
        np.testing.assert_array_equal(a, b)
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(flipped[0], single)) > 1e-2
    first = [line for line in two.stdout.splitlines() if "tfdist: keras.distribution" in line]
    assert first == ["[worker 0] tfdist: keras.distribution.DataParallel -> multi_worker "
                     "(MultiWorkerMirroredStrategy), num_replicas=2, processes=2"], two.stdout
    assert json.loads((procs / "report-1.json").read_text())["num_processes"] == 2

    # A recipe's LayoutMap in place of --strategy: tfdist.train's own tensor parallelism.
    assert ("tfdist: recipe kd_digits's keras.distribution -> --strategy model_parallel "
            "--devices 2 --tensor-parallel 2") in trained.stdout, trained.stdout
    assert "2-way tensor parallel in each" in trained.stdout, trained.stdout
    assert (tmp_path / "run" / "model.keras").exists()

    # 2 processes x 2 devices: batch across processes (shm), model within each.
    for pid in (0, 1):
        _same(single, _weights(hybrid, f"hybrid-{pid}"))
    assert ("[worker 0] tfdist: keras.distribution.ModelParallel -> tensor parallel over "
            "'model' (2 devices), 2 copies across processes (shm), num_replicas=2, "
            "processes=2: d1/kernel (16, 32) split on axis 1: /device:CPU:0 [0:16], "
            "/device:CPU:1 [16:32]") in four.stdout, four.stdout


def test_keras_own_distribution_tests_pass_on_tensorflow(tmp_path):
    """keras/src/distribution/distribution_lib_test.py, shipped in the wheel: the classes the
    TensorFlow backend skips run with their backend check lifted and tfdist imported.
    None is left out: those that mock a backend function mock tfdist's on TensorFlow."""
    import keras

    source = os.path.join(os.path.dirname(keras.__file__), "src", "distribution",
                          "distribution_lib_test.py")
    with open(source, encoding="utf-8") as f:
        text = f.read()
    check = 'backend.backend() != "jax"'
    assert text.count(check) >= 3, "Keras's backend checks moved: update this test"
    (tmp_path / "test_keras_distribution_lib.py").write_text(
        "import tfdist  # noqa: F401\n" + text.replace(check, "False"))
    proc = run_py(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                   str(tmp_path / "test_keras_distribution_lib.py")],
                  env=clean_env(TFDIST_DEVICES="8"), cwd=str(tmp_path))
    summary = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 0, tail(proc)
    assert "failed" not in summary and "skipped" not in summary, summary
    assert int(summary.split(" passed")[0].split()[-1]) >= 39, summary
