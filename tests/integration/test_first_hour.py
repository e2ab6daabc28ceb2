"""A newcomer's first hour (issue 16), with real worker processes.

Quiet logs: a 2-worker digits run through the launcher, read through a pipe
as in a CI log or a Slurm .out file, shows tfdist's lines and one Keras line
per epoch: no escape codes, no TensorFlow C++ start-up lines, no eager-strategy
warnings from tfdist's own preemption agreement.
"""

from __future__ import annotations

import os
import re
import sys

import pytest

from tests.conftest import run_py, tail
from tfdist.compat.tf_startup_logs import is_startup_noise

pytestmark = pytest.mark.integration

EPOCHS = 3


def test_two_worker_run_through_a_pipe_is_quiet(tmp_path):
    log_dir = tmp_path / "logs"
    proc = run_py(["-m", "tfdist.launch", "-n", "2", "--log-dir", str(log_dir), "--",
                   sys.executable, "-m", "tfdist.train", "digits_mlp", "--strategy",
                   "multi_worker", "--epochs", str(EPOCHS), "--threads", "1",
                   "--model-dir", str(tmp_path / "run")])
    assert proc.returncode == 0, tail(proc)
    output = proc.stdout + proc.stderr
    lines = output.splitlines()
    assert "\x1b" not in output and "\r" not in output, output[-2000:]
    assert not [ln for ln in lines if is_startup_noise(ln.split("] ", 1)[-1])], output
    assert "eagerly has significant overhead" not in output
    epoch_lines = [ln for ln in lines if re.match(r"\[worker 0\] 22/22 - .*loss: ", ln)]
    assert len(epoch_lines) == EPOCHS, output
    tfdist_lines = [ln for ln in lines if "] tfdist: " in ln]
    assert len(tfdist_lines) >= 3
    # Everything else is at most a couple of lines per epoch ("Epoch N/M").
    assert len(lines) - len(tfdist_lines) <= 3 * EPOCHS, output
    # The same lines, unprefixed, in one file per worker.
    assert sorted(os.listdir(log_dir)) == ["worker-0.log", "worker-1.log"]
    chief_log = (log_dir / "worker-0.log").read_text()
    assert chief_log.count("22/22 - ") == EPOCHS and "tfdist: test " in chief_log
