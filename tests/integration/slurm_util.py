"""Helpers for tests that submit real Slurm jobs and compare their weights.

Every function takes the environment Slurm's commands run with, so one helper
serves both the default one-node cluster and a second, independent cluster
(whose `SLURM_CONF` names its own config).
"""

from __future__ import annotations

import os
import subprocess
import time

import numpy as np
import pytest

from tests.conftest import REPO
from tests.weights import keras_file_weights as keras_weights

# digits_mlp, 2 epochs of plain SGD at global batch 64, deterministic ops.
ARGS = ["--epochs", "2", "--seed", "0", "--deterministic", "--global-batch-size", "64",
        "--learning-rate", "0.1", "--verbose", "0", "--threads", "1"]
DONE = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def sbatch(script, out, *args, env, opts=(), wait=False, cwd=REPO):
    """Submits SCRIPT (relative: under slurm/) from `cwd`; returns (job id, completed sbatch).

    `wait`: returns once the job is done, the process's returncode then the job's exit
    code, as `sbatch --wait` would. Polled (`wait_job`), not `sbatch --wait`: that sleeps
    2, 8, then 32 s between its polls, so a 12 s job returned after 42 s.
    """
    cmd = ["sbatch", "--parsable", f"--output={out}", *opts,
           os.path.join(REPO, "slurm", script), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=cwd)
    job = proc.stdout.strip().split(";")[0].splitlines()[0] if proc.stdout.strip() else None
    if wait and proc.returncode == 0 and job:
        proc.returncode = wait_job(job, env)
    return job, proc


def wait_job(job, env=None, timeout=300):
    """Polls until `job` is done; returns its exit code (128 + the signal that ended it)."""
    wait_all([job], env, timeout)
    code, signal = (int(x) for x in job_fields(job, env)["ExitCode"].split(":"))
    return 128 + signal if signal else code


def job_fields(job, env=None):
    """`scontrol show job` fields as a dict (finished jobs stay for MinJobAge)."""
    text = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True,
                          env=env).stdout
    return dict(f.split("=", 1) for f in text.split() if "=" in f)


def wait_all(jobs, env=None, timeout=300):
    """Polls until every job is done; returns how often all were RUNNING together."""
    deadline, together = time.monotonic() + timeout, 0
    while True:
        states = [job_fields(j, env).get("JobState") for j in jobs]
        together += all(s == "RUNNING" for s in states)
        if all(s in DONE for s in states):
            return together
        if time.monotonic() > deadline:
            subprocess.run(["scancel", *jobs], env=env)
            pytest.fail(f"jobs {jobs} still {states} after {timeout} s")
        time.sleep(0.5)


def assert_same_weights(model_dir, baseline):
    """model_dir/model.keras holds `baseline`'s weights (rtol 1e-5)."""
    got = keras_weights(os.path.join(model_dir, "model.keras"))
    assert len(got) == len(baseline) > 0
    for a, b in zip(got, baseline):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def single_replica_weights(shared_run):
    """digits_mlp with ARGS in one process, one replica: its final weights.

    That run is test_data_parallel's single run (the same options, trainer.train,
    model.keras written), trained once for the session by `shared_run`
    (tests/integration/conftest.py) for every module that compares with it.
    """
    from tests.integration.test_data_parallel import COMMON, single_run

    assert COMMON == ["digits_mlp", *ARGS], (COMMON, ARGS)  # one command line, both names
    _, model_dir, _ = shared_run(single_run)
    return keras_weights(os.path.join(model_dir, "model.keras"))
