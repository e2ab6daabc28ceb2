"""The README's launch-mode table, run in order as written in a fresh directory.

Every row that runs on one machine without a scheduler (`python -m tfdist...`)
runs once (with `--epochs 1` appended: few epochs): each trains in its own
default model dir. Then reruns: a finished run says "already finished",
exits 0 and rewrites nothing; another configuration on the same dir is
refused by name; a larger --epochs extends the run and says so.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys

import pytest

from tests.conftest import REPO, run_py, tail

pytestmark = pytest.mark.integration


def launch_table_commands() -> list[str]:
    """The command column of README.md's "Launch modes" table, in order."""
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    section = text.split("## Launch modes", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and "`" in ln]
    return [re.search(r"`([^`]+)`", row.split("|")[2]).group(1) for row in rows]


def _run(command: str, cwd: str, *extra: str):
    argv = shlex.split(command) + list(extra)
    if "numbers_to_words" in argv:  # 312 steps an epoch (about 60 s across 2 processes)
        argv += ["--steps-per-epoch", "30"]
    assert argv[0] == "python"
    if "tfdist.launch" in argv:  # the workers' python: this interpreter too
        argv = [sys.executable if a == "python" else a for a in argv]
    return run_py([*argv[1:]], cwd=cwd, timeout=300)


def _snapshot(cwd):
    out = {}
    for d, _, files in os.walk(os.path.join(cwd, "runs")):
        for f in files:
            p = os.path.join(d, f)
            if f in ("metrics.json", "model.keras") or f.startswith("ckpt-"):
                out[p] = (os.stat(p).st_mtime_ns, open(p, "rb").read())
    return out


def test_readme_launch_table_in_order_then_reruns(tmp_path):
    # The Horovod row runs in the Horovod venv: tests/integration/test_horovod.py runs it.
    commands = [c for c in launch_table_commands()
                if c.startswith("python -m tfdist.") and "horovodrun" not in c]
    assert len(commands) >= 5, commands  # single, mirrored, multi-worker, shm, ps
    cwd = str(tmp_path)
    dirs = []
    for command in commands:
        proc = _run(command, cwd, "--epochs", "1")
        assert proc.returncode == 0, f"{command}\n{tail(proc)}"
        wrote = re.search(r"tfdist: test .*; wrote (\S+)/model\.keras", proc.stdout)
        assert wrote, f"{command} did not train:\n{tail(proc)}"
        assert "already finished" not in proc.stdout
        dirs.append(wrote.group(1))
        metrics = json.load(open(os.path.join(cwd, dirs[-1], "metrics.json")))
        assert metrics["global_step"] > 0 and metrics["examples_per_s"] > 0
    assert len(set(dirs)) == len(dirs), dirs  # no two launch modes share a model dir
    # Each named as the README's "Run dirs" paragraph says (`single`, `multi_worker-2w`, ...).
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    assert [d for d in dirs if f"`{os.path.basename(d)}`" not in readme] == [], dirs

    before = _snapshot(cwd)
    for command, model_dir in zip(commands, dirs):
        proc = _run(command, cwd, "--epochs", "1")
        assert proc.returncode == 0, f"{command}\n{tail(proc)}"
        assert f"{model_dir} already finished (1 epochs), nothing to do" in proc.stdout, tail(proc)
        assert "wrote" not in proc.stdout
    assert _snapshot(cwd) == before  # nothing rewritten

    proc = _run(commands[0], cwd, "--epochs", "1", "--learning-rate", "0.2")
    assert proc.returncode == 2, tail(proc)
    assert "--learning-rate 0.1 there, 0.2 here" in proc.stderr
    assert "--no-resume" in proc.stderr and "--model-dir DIR" in proc.stderr

    proc = _run(commands[0], cwd, "--epochs", "2")
    assert proc.returncode == 0, tail(proc)
    assert f"extending the run in {dirs[0]} from 1 to 2 epochs (1 done)" in proc.stdout
    metrics = json.load(open(os.path.join(cwd, dirs[0], "metrics.json")))
    assert len(metrics["history"]["loss"]) == 2 and metrics["epochs"] == 2
