"""`tfdist.bench.bind` and the benchmarks' `--cpu-bind`: the shares, the commands and real binding."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, clean_env, tail
from tfdist.bench import bind, runs
from tfdist.launch import core_sets

AFFINITY = "import os, json; print(json.dumps(sorted(os.sched_getaffinity(0))))"
CPUS = sorted(os.sched_getaffinity(0))


def test_share_is_parsed_and_checked():
    assert bind.parse_share("1/2") == (1, 2)
    for bad in ("2/2", "1", "-1/2", "a/b", "1/0"):
        with pytest.raises(ValueError, match=f"Received: '{bad}'"):
            bind.parse_share(bad)


def test_commands_bind_only_when_asked():
    plain = runs.launch_command(2, "m", ["x"], 60)
    assert "--cpu-bind" not in plain
    bound = runs.launch_command(2, "m", ["x"], 60, "cores")
    assert bound[bound.index("--cpu-bind") + 1] == "cores" and bound.index("--") > bound.index(
        "--cpu-bind")
    hvd = runs.horovod_command("/v", 2, "gloo", "m", ["x"], cpu_bind="cores")
    assert hvd[-8:] == ["/v/bin/python", "-m", "tfdist.bench.bind", "--",
                        "/v/bin/python", "-m", "m", "x"]
    assert "tfdist.bench.bind" not in runs.horovod_command("/v", 2, "gloo", "m", ["x"])
    with pytest.raises(ValueError, match="'all'"):
        runs.launch_command(2, "m", [], 60, "all")
    baseline = runs.launch_command(1, "m", ["x"], 60, share="0/2")
    assert baseline[baseline.index("--") + 1:] == [
        sys.executable, "-m", "tfdist.bench.bind", "--share", "0/2", "--",
        sys.executable, "-m", "m", "x"]


def _affinity(args, **env):
    proc = subprocess.run([sys.executable, "-m", "tfdist.bench.bind", *args, "--",
                           sys.executable, "-c", AFFINITY], capture_output=True, text=True,
                          env=clean_env(PYTHONPATH=REPO, **env), cwd=REPO, timeout=60)
    assert proc.returncode == 0, tail(proc)
    return json.loads(proc.stdout)


@pytest.mark.integration
@pytest.mark.parametrize("index", [0, 1])
def test_the_command_runs_on_its_share(index):
    assert _affinity(["--share", f"{index}/2"]) == core_sets(CPUS, 2)[index]


@pytest.mark.integration
def test_a_horovod_rank_takes_its_local_rank_share():
    got = _affinity([], HOROVOD_RANK="1", HOROVOD_SIZE="2", HOROVOD_LOCAL_RANK="1")
    assert got == core_sets(CPUS, 2)[1]


@pytest.mark.integration
def test_without_a_share_or_rank_it_says_what_to_pass():
    proc = subprocess.run([sys.executable, "-m", "tfdist.bench.bind", "--", "true"],
                          capture_output=True, text=True, env=clean_env(PYTHONPATH=REPO),
                          cwd=REPO, timeout=60)
    assert proc.returncode == 2 and "--share I/N" in proc.stderr, tail(proc)
    assert "Traceback" not in proc.stderr


@pytest.mark.integration
def test_horovodrun_ranks_run_on_their_shares(tmp_path):
    """The benchmarks' bound Horovod command, run: each rank reports its own share."""
    venv = runs.horovod_venv()
    if venv is None:
        if os.environ.get("CI"):
            pytest.fail("CI must run the Horovod tests: run scripts/install_horovod.sh")
        pytest.skip("no Horovod venv (scripts/install_horovod.sh)")
    (tmp_path / "show_affinity.py").write_text(
        "import json, os\nprint('AFFINITY', os.environ['HOROVOD_RANK'], "
        "json.dumps(sorted(os.sched_getaffinity(0))), flush=True)\n")
    cmd = runs.horovod_command(venv, 2, "gloo", "show_affinity", [], cpu_bind="cores")
    env = {k: v for k, v in clean_env(PYTHONPATH=f"{REPO}:{tmp_path}").items()
           if not k.startswith(("HOROVOD_", "OMPI_"))}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert proc.returncode == 0, tail(proc)
    got = {}
    for line in proc.stdout.splitlines():
        if "AFFINITY " in line:
            rank, cpus = line.split("AFFINITY ", 1)[1].split(" ", 1)
            got[int(rank)] = json.loads(cpus)
    assert got == {0: core_sets(CPUS, 2)[0], 1: core_sets(CPUS, 2)[1]}, proc.stdout
