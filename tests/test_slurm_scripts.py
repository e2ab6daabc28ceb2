"""slurm/*.sbatch checked without Slurm: syntax, log location, finding the Horovod venv."""

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

# Every test here runs a batch script or a process it starts.
pytestmark = pytest.mark.integration

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
    (venv / "bin" / "horovodrun").write_text("#!/bin/sh\nexit 1\n")  # marks the venv
    (venv / "bin" / "horovodrun").chmod(0o755)
    # The script runs `python -m tfdist.horovodrun`, which runs horovodrun's own
    # command line in-process: a stand-in horovod records how it was called.
    record, fake = tmp_path / "horovodrun-args", tmp_path / "fake" / "horovod" / "runner"
    (fake / "common" / "util").mkdir(parents=True)
    (fake.parent / "tensorflow").mkdir()  # what tfdist checks for before running
    for d in (fake.parent, fake.parent / "tensorflow", fake, fake / "common",
              fake / "common" / "util"):
        (d / "__init__.py").write_text("")
    (fake / "common" / "util" / "safe_shell_exec.py").write_text(
        "GRACEFUL_TERMINATION_TIME_S = 5\ndef _exec_middleman(*a): pass\n")
    (fake / "gloo_run.py").write_text("def get_remote_command(*a, **k): pass\n")
    (fake / "launch.py").write_text(
        "import os, sys\nfrom horovod.runner.common.util import safe_shell_exec as s\n"
        "def run_commandline():\n"
        f"    open({str(record)!r}, 'w').write(' '.join(sys.argv[1:]) + '\\n'\n"
        "        + 'PYTHONPATH=' + os.environ['PYTHONPATH'] + '\\n'\n"
        "        + f'grace={s.GRACEFUL_TERMINATION_TIME_S:g}\\n')\n")
    proc = _run_horovod_sbatch(tmp_path, TFDIST_HOROVOD_VENV=str(venv),
                               PYTHONPATH=str(tmp_path / "fake"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    args, pythonpath, grace = record.read_text().splitlines()
    assert args.startswith(f"--gloo -np 2 -H localhost:2 {venv}/bin/python -m tfdist.train "
                           "digits_mlp --strategy horovod --status-file ")
    assert grace == "grace=60"  # tfdist.horovodrun's, not horovodrun's 5 s
    assert pythonpath.startswith(f"PYTHONPATH={REPO}")
