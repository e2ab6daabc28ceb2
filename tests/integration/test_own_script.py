"""tfdist in your own script: the documented examples, run exactly as printed.

The README's `# my_fit.py` (TensorFlow's multi-worker Keras tutorial shape)
and docs/own_script.md's `# my_loop.py` (a custom training loop) blocks are
extracted from those pages, saved as files and run as one process and as 2 real workers
under `tfdist.launch`; both end with the same weights (a fixed global batch
of 64). recipes/TEMPLATE.py, copied as a user would, trains on 2 workers
with its optimizer, callback and train-step hooks.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys

import numpy as np
import pytest

from tests.conftest import REPO, clean_env, run_py, tail
from tests.weights import keras_model_weights as _weights
from tfdist.compat.tf_startup_logs import is_startup_noise

pytestmark = pytest.mark.integration


# The pages that print a script; each block's first line names its file.
PAGES = ("README.md", os.path.join("docs", "own_script.md"))


def readme_block(first_line: str) -> str:
    """The one ```python block of README.md or docs/own_script.md whose first line is `first_line`."""
    blocks = []
    for page in PAGES:
        text = open(os.path.join(REPO, page), encoding="utf-8").read()
        blocks += [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S)
                   if b.startswith(first_line + "\n") or b.startswith(first_line + ":")]
    assert len(blocks) == 1, f"{PAGES} must hold one block starting {first_line!r}"
    return blocks[0]


def assert_no_startup_lines(proc) -> None:
    """Fails when TensorFlow's C++ start-up lines reached the output (worker prefixes removed).

    The README's scripts call tfdist.setup() before importing TensorFlow, so it
    imports TensorFlow with those lines hidden; importing it first printed them.
    """
    lines = [re.sub(r"^\[worker \d+\] ", "", ln)
             for ln in (proc.stdout + proc.stderr).splitlines()]
    noise = [ln for ln in lines if is_startup_noise(ln)]
    assert not noise, "TensorFlow's start-up lines were printed:\n" + "\n".join(noise)


@pytest.mark.parametrize("name, printed", [
    ("my_fit.py", "replica(s), strategy "),
    ("my_loop.py", "step 60: loss "),
])
def test_readme_script_runs_as_printed_on_one_and_two_workers(tmp_path, name, printed):
    script = tmp_path / name
    script.write_text(readme_block(f"# {name}"))
    model = os.path.join("runs", name[:-3], "model.keras")  # the path the block saves to
    one, two = tmp_path / "one", tmp_path / "two"
    for d in (one, two):
        d.mkdir()
    # What a person sees: no TF_CPP_MIN_LOG_LEVEL (clean_env sets one), output in a pipe.
    env = {k: v for k, v in clean_env().items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = run_py([str(script)], cwd=str(one), env=env)
    assert proc.returncode == 0, tail(proc)
    assert printed in proc.stdout
    assert_no_startup_lines(proc)
    proc = run_py(["-m", "tfdist.launch", "-n", "2", "--timeout", "200", "--",
                   sys.executable, str(script)], cwd=str(two), env=env)
    assert proc.returncode == 0, tail(proc)
    assert_no_startup_lines(proc)
    chief = [ln for ln in proc.stdout.splitlines() if printed in ln]
    assert chief and all(ln.startswith("[worker 0] ") for ln in chief)  # the chief prints
    if name == "my_fit.py":
        assert "2 replica(s), strategy multi_worker" in proc.stdout
    for a, b in zip(_weights(str(one / model)), _weights(str(two / model))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_template_recipe_copied_by_a_user_trains_on_two_workers(tmp_path):
    recipe = tmp_path / "my_model.py"
    shutil.copy(os.path.join(REPO, "recipes", "TEMPLATE.py"), recipe)
    proc = run_py(["-m", "tfdist.launch", "-n", "2", "--timeout", "200", "--", sys.executable,
                   "-m", "tfdist.train", str(recipe), "--strategy", "multi_worker",
                   "--epochs", "2", "--model-dir", str(tmp_path / "run")])
    assert proc.returncode == 0, tail(proc)
    assert "[worker 0] TEMPLATE: epoch 2 done" in proc.stdout  # its callback, chief only
    assert "[worker 1] TEMPLATE:" not in proc.stdout
    metrics = json.load(open(tmp_path / "run" / "metrics.json"))
    history = metrics["history"]
    assert len(history["grad_norm"]) == 2  # its train_step's extra metric
    assert history["loss"][1] < history["loss"][0]
    assert metrics["test"]["accuracy"] > 0.6
