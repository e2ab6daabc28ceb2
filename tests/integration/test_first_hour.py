"""A newcomer's first hour (issue 16), with real worker processes.

Quiet logs: a 2-worker digits run through the launcher, read through a pipe
as in a CI log or a Slurm .out file, shows tfdist's lines and one Keras line
per epoch: no escape codes, no TensorFlow C++ start-up lines, no eager-strategy
warnings from tfdist's own preemption agreement.

Round 3 (#38): a pipeline split that cannot work (a batch its copies and
micro-batches cannot share, stages that do not divide the processes, a model
too small for them) is refused with one line, exit 2, no traceback, no dir
left, and the stage processes end quietly.
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


# Round 3 (#38): splits that cannot work, refused in one line, before TensorFlow where
# the command line says it (the batch against copies x micro-batches, the stages
# against the processes). tfdist.launch shows a refusal that every worker prints once.
BAD_SPLITS = {
    "68 over 2 copies x 4 micro-batches": (
        4, ["--stages", "2", "--microbatches", "4", "--global-batch-size", "68"],
        "--global-batch-size 68 cannot be cut into 2 data-parallel copies x 4 micro-batches"),
    "33 over 2 copies": (4, ["--stages", "2", "--global-batch-size", "33"],
                         "--global-batch-size 33 cannot be cut into 2 data-parallel copies"),
    "3 stages on 4 processes": (4, ["--stages", "3"], "--stages 3 on 4 task(s)"),
}


def _refused_in_one_line(proc, says, cwd, seconds, within=15.0):
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 2, tail(proc)
    assert "Traceback" not in proc.stdout + proc.stderr, tail(proc)
    errors = [ln for ln in lines if "error: " in ln]
    assert len(errors) == 1 and says in errors[0], tail(proc)
    assert "SIGTERM received" not in proc.stdout, tail(proc)  # the stages end quietly
    assert not os.path.exists(os.path.join(cwd, "runs")), os.listdir(cwd)  # no backup/ left
    assert seconds < within, f"{seconds:.1f} s"
    return lines


@pytest.mark.parametrize("name", list(BAD_SPLITS))
def test_a_split_the_command_line_rules_out_is_refused_once_before_tensorflow(name, tmp_path):
    import time

    n, args, says = BAD_SPLITS[name]
    start = time.monotonic()
    proc = run_py(["-m", "tfdist.launch", "-n", str(n), "--", sys.executable, "-m",
                   "tfdist.train", "digits_mlp", "--strategy", "pipeline", *args], timeout=60,
                  cwd=str(tmp_path))
    lines = _refused_in_one_line(proc, says, str(tmp_path), time.monotonic() - start)
    assert len(lines) == 1, tail(proc)  # no launcher line besides it, no TensorFlow output


def test_a_model_too_small_for_the_processes_is_refused_with_advice_that_works_there(tmp_path):
    # digits_mlp has 2 layers with weights: not 3 stages. Known once the model is built.
    import time

    start = time.monotonic()
    proc = run_py(["-m", "tfdist.launch", "-n", "3", "--", sys.executable, "-m",
                   "tfdist.train", "digits_mlp", "--strategy", "pipeline", "--verbose", "0"],
                  timeout=120, cwd=str(tmp_path))
    _refused_in_one_line(proc, "Cannot split the model into 3 stages: it can be cut into at "
                               "most 2", str(tmp_path), time.monotonic() - start, within=60)
    err = proc.stderr
    assert "Start 2 processes (python -m tfdist.launch -n 2" in err, tail(proc)
    assert "--devices" not in err and "--placement" not in err  # refused across processes
