"""A newcomer's first hour (issue 16), with real worker processes.

Quiet logs: a 2-worker digits run through the launcher, read through a pipe
as in a CI log or a Slurm .out file, shows tfdist's lines and one Keras line
per epoch: no escape codes, no TensorFlow C++ start-up lines, no eager-strategy
warnings from tfdist's own preemption agreement.
"""

from __future__ import annotations

import os
import pathlib
import re
import sys

import pytest

from tests.conftest import run_py, tail, wait_for_checkpoint
from tests.weights import keras_model_weights as _weights
from tfdist.compat.tf_startup_logs import is_startup_noise

pytestmark = pytest.mark.integration

EPOCHS = 3


def quiet_run(tmp):
    """(process, log dir, model dir) of the README's multi-worker command with EPOCHS epochs,
    one thread and --log-dir. test_data_parallel's README test checks the same run
    (tests/integration/conftest.py: trained once)."""
    log_dir, model_dir = os.path.join(tmp, "logs"), os.path.join(tmp, "run")
    proc = run_py(["-m", "tfdist.launch", "-n", "2", "--log-dir", log_dir, "--",
                   sys.executable, "-m", "tfdist.train", "digits_mlp", "--strategy",
                   "multi_worker", "--epochs", str(EPOCHS), "--threads", "1",
                   "--model-dir", model_dir])
    return proc, log_dir, model_dir


def test_two_worker_run_through_a_pipe_is_quiet(shared_run):
    proc, log_dir, _ = shared_run(quiet_run)
    log_dir = pathlib.Path(log_dir)
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


def test_sigint_to_the_launcher_saves_reports_once_per_worker_and_rerun_resumes(tmp_path,
                                                                                shared_run):
    import signal
    import subprocess

    import numpy as np

    from tests.conftest import REPO, clean_env
    from tests.integration.test_data_parallel import single_run

    common = ["digits_mlp", "--epochs", "2", "--deterministic", "--threads", "1"]
    # The reference: one replica trained with these options (test_data_parallel's, which
    # spells out this command line's defaults: seed 0, global batch 64, learning rate 0.1).
    _, base_dir, _ = shared_run(single_run)
    model_dir = str(tmp_path / "run")
    # Worker 0 sleeps 150 ms a step so that the interrupt lands mid-run.
    command = [sys.executable, "-m", "tfdist.launch", "-n", "2", "--", sys.executable, "-m",
               "tfdist.train", *common, "--strategy", "multi_worker", "--model-dir", model_dir,
               "--save-every-steps", "4", "--straggler-delay-ms", "150"]
    launcher = subprocess.Popen(command, cwd=REPO, env=clean_env(), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    backup_dir = os.path.join(model_dir, "backup")
    try:
        wait_for_checkpoint(model_dir, lambda: launcher.poll() is None, what="the launcher")
        launcher.send_signal(signal.SIGINT)
        out, err = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 130, err[-3000:]
    lines = [ln for ln in err.splitlines() if "interrupted at step" in ln]
    assert sorted(ln.split("]")[0] for ln in lines) == ["[worker 0", "[worker 1"], err
    step = int(lines[0].split("interrupted at step ")[1].split(";")[0])
    assert all(f"interrupted at step {step}; backup " in ln and ln.endswith(
        "; rerun to continue") for ln in lines)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    # No C++ error lines either (#30 saw three "E0000 ... StartAbort" after Ctrl-C).
    assert not [ln for ln in (out + err).splitlines() if re.search(r"\bE0000\b|StartAbort", ln)]
    assert "SIGINT: worker 0 interrupted (exit code 130), worker 1 interrupted (exit code " \
           "130)" in err or "SIGINT: worker 1 interrupted (exit code 130), worker 0" in err
    assert sorted(os.listdir(backup_dir))[-1] == f"ckpt-{step:010d}.npz" and 0 < step < 44
    assert "metrics.json" not in os.listdir(model_dir)

    rerun = run_py(command[1:])  # the same command again
    assert rerun.returncode == 0, tail(rerun)
    assert f"(global step {step})" in rerun.stdout
    for a, b in zip(_weights(os.path.join(base_dir, "model.keras")),
                    _weights(os.path.join(model_dir, "model.keras"))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_help_into_a_pipe_closed_early_ends_quietly():
    """`python -m tfdist.train digits_mlp --help | head -5`: no BrokenPipeError traceback."""
    import subprocess

    read, write = os.pipe()
    os.close(read)  # the reader has left before the first write: every write fails
    try:
        proc = subprocess.run([sys.executable, "-m", "tfdist.train", "digits_mlp", "--help"],
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write)
    assert proc.returncode == 141 and "Traceback" not in proc.stderr, proc.stderr
