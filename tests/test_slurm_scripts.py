"""slurm/*.sbatch checked without Slurm: syntax, log location, finding the Horovod venv."""

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

SCRIPTS = ["horovod.sbatch", "multi_worker.sbatch", "mirrored.sbatch"]


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_parses_and_logs_under_ignored_logs_dir(name):
    path = os.path.join(REPO, "slurm", name)
    assert subprocess.run(["bash", "-n", path]).returncode == 0
    assert "#SBATCH --output=logs/%x-%j.out" in open(path).read()
    ignored = subprocess.run(["git", "check-ignore", "-q", "logs/tfdist-mw-1.out"], cwd=REPO)
    assert ignored.returncode == 0 and os.path.isfile(os.path.join(REPO, "logs", ".gitignore"))


def _run_horovod_sbatch(tmp_path, **env):
    base = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_SUBMIT_DIR": REPO,
            "SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "localhost",
            "SLURM_TASKS_PER_NODE": "2"}
    return subprocess.run(["bash", os.path.join(REPO, "slurm", "horovod.sbatch"), "digits_mlp"],
                          env={**base, **env}, capture_output=True, text=True, timeout=60)


def test_horovod_sbatch_without_a_venv_fails_with_the_install_hint(tmp_path):
    proc = _run_horovod_sbatch(tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "tfdist-slurm: horovodrun not found" in proc.stderr
    assert "HINT: run scripts/install_horovod.sh once" in proc.stderr


def test_horovod_sbatch_uses_the_install_scripts_venv(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(sys.executable, venv / "bin" / "python")
    record = tmp_path / "horovodrun-args"
    fake = venv / "bin" / "horovodrun"  # records how it was called instead of training
    fake.write_text(f'#!/bin/sh\necho "$@" > {record}\necho "PYTHONPATH=$PYTHONPATH" >> {record}\n')
    fake.chmod(0o755)
    proc = _run_horovod_sbatch(tmp_path, TFDIST_HOROVOD_VENV=str(venv))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    args, pythonpath = record.read_text().splitlines()
    assert args.startswith(f"--gloo -np 2 -H localhost:2 {venv}/bin/python -m tfdist.train "
                           "digits_mlp --strategy horovod --status-file ")
    assert pythonpath.startswith(f"PYTHONPATH={REPO}")
