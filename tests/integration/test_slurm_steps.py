"""Slurm job steps and node lists against the real Slurm (slurm/local_cluster.sh).

* Two `srun` steps at once in one allocation (`srun ... &` twice) get different
  ports (SLURM_STEP_ID is part of them) and both train, to the same weights
  (the same deterministic run twice; test_slurm_jobs.py shows such a run equals
  one replica).
* `scontrol show hostnames` is the oracle for tfdist's node-list parser: on
  node lists drawn from a grammar of valid and invalid forms, tfdist expands
  what Slurm expands, to the same hosts, and refuses what Slurm refuses.

Skipped without the cluster, except under CI (CI set), where that fails (see
the `slurm_cluster` fixture).
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.slurm_util import keras_weights, sbatch
from tests.integration.test_slurm_jobs import _env, slurm_cluster  # noqa: F401
from tfdist.cluster.slurm import expand_hostlist

pytestmark = pytest.mark.integration
ARGS = ["--epochs", "1", "--steps-per-epoch", "8", "--seed", "0", "--deterministic",
        "--global-batch-size", "64", "--learning-rate", "0.1", "--verbose", "0",
        "--threads", "1"]

# Each task says where it listens and when it trained, then trains like `tfdist.train`.
STEP = ("import json, os, sys, time; from tfdist.cluster import detect\n"
        "from tfdist.train import main\n"
        "info = detect(); start = time.time(); rc = main(sys.argv[1:])\n"
        "print('STEP', json.dumps(dict(step=os.environ['SLURM_STEP_ID'], rank=info.worker_index,"
        " addresses=info.worker_addresses, start=start, end=time.time(), rc=rc)), flush=True)\n"
        "sys.exit(rc)")
BATCH = """#!/usr/bin/env bash
#SBATCH --ntasks=2
#SBATCH --time=00:15:00
cd "$SLURM_SUBMIT_DIR" || exit 1
# --overlap: both steps share the allocation's CPUs, so they run at the same time.
srun --overlap -n 2 "$PYTHON" -c "$STEP" digits_mlp $ARGS --strategy multi_worker --model-dir "$1" &
a=$!
srun --overlap -n 2 "$PYTHON" -c "$STEP" digits_mlp $ARGS --strategy multi_worker --model-dir "$2" &
b=$!
wait $a; ra=$?
wait $b; rb=$?
echo "tfdist-test: steps exited $ra $rb"
exit $((ra | rb))
"""


def test_two_steps_at_once_in_one_allocation_both_train(slurm_cluster, tmp_path):
    script, out = tmp_path / "two_steps.sbatch", tmp_path / "job-%j.out"
    script.write_text(BATCH)
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    job, proc = sbatch(str(script), str(out), *dirs, env=_env(STEP=STEP, ARGS=" ".join(ARGS)),
                       wait=True, cwd=str(tmp_path))
    log = open(str(out).replace("%j", job)).read() if job else ""
    assert proc.returncode == 0, f"{proc.stderr}\nJOB LOG:\n{log[-4000:]}"
    assert "tfdist-test: steps exited 0 0" in log, log[-4000:]
    steps: dict[str, dict] = {}
    for line in log.splitlines():
        if line.startswith("STEP "):
            task = json.loads(line[5:])
            steps.setdefault(task["step"], {})[task["rank"]] = task
    assert len(steps) == 2 and all(len(ranks) == 2 for ranks in steps.values()), log[-4000:]
    a, b = (ranks[0] for ranks in steps.values())
    assert a["rc"] == b["rc"] == 0
    assert len(set(a["addresses"])) == len(set(b["addresses"])) == 2
    assert not set(a["addresses"]) & set(b["addresses"]), (a, b)  # different ports
    # Both trained at the same time: their training intervals overlap.
    assert max(a["start"], b["start"]) < min(a["end"], b["end"]), steps
    for model_dir in dirs:
        metrics = json.load(open(f"{model_dir}/metrics.json"))
        assert (metrics["num_workers"], metrics["global_step"]) == (2, 8)
    first, second = (keras_weights(f"{d}/model.keras") for d in dirs)
    assert len(first) == len(second) > 0
    for x, y in zip(first, second):
        np.testing.assert_array_equal(x, y)


# --- scontrol show hostnames as the oracle ---------------------------------------------

names = st.sampled_from(["n", "node", "gpu-", "r1.c", "a_b", ""])
numbers = st.integers(0, 30).map(str) | st.sampled_from(["00", "01", "007", "9", "10"])
ranges = st.one_of(numbers, st.tuples(numbers, numbers).map("-".join),
                   st.sampled_from(["0-70000", "5-2", "1-", "-1", "a", ""]))
brackets = st.lists(ranges, min_size=1, max_size=3).map(lambda r: "[" + ",".join(r) + "]")
suffix = st.sampled_from(["", "", "", "x", "-a"])
token = st.one_of(
    st.tuples(names, numbers).map("".join),
    st.tuples(names, brackets, suffix).map("".join),
    st.tuples(names, brackets, names, brackets).map("".join),  # r[1-2]-n[1-2]
).filter(bool)
hostlists = st.lists(token, min_size=1, max_size=3).map(",".join)


def _slurm_hostnames(text: str):
    proc = subprocess.run(["scontrol", "show", "hostnames", text], capture_output=True,
                          text=True, timeout=30)
    # scontrol (22.05) exits 0 on a bad list, saying "Invalid hostlist" on stderr.
    bad = proc.returncode != 0 or "Invalid hostlist" in proc.stderr or not proc.stdout.strip()
    return None if bad else proc.stdout.split()


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(text=hostlists)
def test_node_lists_expand_as_slurm_does(slurm_cluster, text):
    oracle = _slurm_hostnames(text)
    try:
        ours = expand_hostlist(text)
    except ValueError as e:
        assert oracle is None, f"Slurm expands {text!r} to {oracle[:5]}..., tfdist refuses: {e}"
        return
    assert oracle == ours, text


def test_oracle_rejects_what_the_issue_names(slurm_cluster):
    for text in ("n[1-2]x", "n[0-70000]"):
        assert _slurm_hostnames(text) is None, text
        with pytest.raises(ValueError):
            expand_hostlist(text)
    assert _slurm_hostnames("r[1-2]-n[01-02]") == expand_hostlist("r[1-2]-n[01-02]") == [
        "r1-n01", "r1-n02", "r2-n01", "r2-n02"]
