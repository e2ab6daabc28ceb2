"""Real `sbatch -N 2` jobs on a 2-node Slurm cluster whose nodes are namespaced hosts.

`slurm/local_cluster.sh start --nodes 2` runs slurmctld here and one slurmd on
each of two tfdist.hosts hosts (own network stack, address and hostname), so a
job's tasks run on different hosts and reach each other by node name. This
module starts its own such cluster beside the one-node cluster the other Slurm
tests use (its own config, state dir, ports and hosts; see `nodes_env`), and
removes it after, so the rest of the suite never sees it.

Whatever the batch script, the final weights must equal one single-replica
process's, also when a `--nodes=1-2` job loses a node and is requeued onto the
one left. Without Slurm or namespaces the tests skip, saying why, except under
CI (CI set), where they fail.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys

import pytest

from tests.conftest import REPO, WORKERS, clean_env, tail, wait_for_checkpoint
from tests.integration.slurm_util import (ARGS, assert_same_weights, job_fields,
                                           sbatch, single_replica_weights, wait_all)

pytestmark = pytest.mark.integration

CLUSTER = os.path.join(REPO, "slurm", "local_cluster.sh")
STATE = "/var/lib/tfdist-slurm-nodes-test"
VENV = os.environ.get("TFDIST_HOROVOD_VENV",
                      os.path.expanduser("~/.cache/tfdist/horovod-venv"))


def _skip_or_fail(reason):
    if os.environ.get("CI"):
        pytest.fail(f"CI needs a 2-node Slurm cluster on namespaced hosts: {reason}")
    print(f"SKIP: {reason}")
    pytest.skip(reason)


def _free_port_pair():
    """A port P with P+1 also free here (slurmctld's and, on the hosts, slurmd's)."""
    for port in range(6830, 6900, 2):
        try:
            for p in (port, port + 1):
                with socket.socket() as s:
                    s.bind(("0.0.0.0", p))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair in 6830..6899 for the test's slurmctld")


@pytest.fixture(scope="module")
def nodes_env():
    """Environment of a fresh 2-node cluster (h0, h1); stopped, hosts and all, after."""
    from tfdist.hosts import unavailable

    if not shutil.which("sbatch"):
        _skip_or_fail("sbatch is not installed (run slurm/local_cluster.sh install)")
    reason = unavailable()
    if reason:
        _skip_or_fail(reason)
    cluster_env = dict(TFDIST_SLURM_DIR=STATE, SLURM_CONF=os.path.join(STATE, "slurm.conf"),
                       TFDIST_SLURM_PORT=str(_free_port_pair()), TFDIST_SLURM_HOSTS="slurmtest")
    env = clean_env(PYTHON=sys.executable, **cluster_env)
    # Whatever an interrupted run left behind goes first.
    subprocess.run([CLUSTER, "stop"], capture_output=True, env=env, timeout=120)
    proc = subprocess.run([CLUSTER, "start", "--nodes", "2"], capture_output=True, text=True,
                          env=env, timeout=180)
    try:
        if proc.returncode != 0:
            _skip_or_fail(f"`local_cluster.sh start --nodes 2` failed: {tail(proc)}")
        yield env
    finally:
        stop = subprocess.run([CLUSTER, "stop"], capture_output=True, text=True, env=env,
                              timeout=120)
        assert stop.returncode == 0, tail(stop)


@pytest.fixture(scope="module")
def baseline(shared_run):
    """Final weights of one process, one replica, the same global batch."""
    return single_replica_weights(shared_run)


def test_cluster_has_two_nodes_on_their_own_hosts(nodes_env):
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True,
                         env=nodes_env).stdout.split()
    assert out[0::2] == ["h0", "h1"] and all(s in ("idle", "mixed") for s in out[1::2]), out
    addresses = subprocess.run(["scontrol", "show", "node"], capture_output=True, text=True,
                               env=nodes_env).stdout
    assert len(set(re.findall(r"NodeAddr=(198\.1[89]\.\d+\.\d+)", addresses))) == 2, addresses


def test_two_node_multi_worker_jobs_span_both_hosts_run_at_once_and_equal_one_replica(
        nodes_env, baseline, tmp_path):
    # Job a's PYTHON is a wrapper that prints each task's hostname and network namespace.
    # Each job takes one of each node's 2 CPUs, so both run at once.
    where_env = {**nodes_env, "PYTHON": os.path.join(WORKERS, "where_python.sh"),
                 "REAL_PYTHON": sys.executable}
    jobs = []
    for name, env in (("a", where_env), ("b", nodes_env)):
        job, proc = sbatch("multi_worker.sbatch", str(tmp_path / f"{name}-%j.out"),
                           "digits_mlp", *ARGS, "--model-dir", str(tmp_path / name),
                           opts=["-N", "2", "--ntasks-per-node=1"], env=env)
        assert proc.returncode == 0 and job, tail(proc)
        jobs.append(job)
    # Polled: `sbatch --wait` sleeps up to 32 s between its own polls.
    together = wait_all(jobs, nodes_env)
    logs = {}
    for name, job in zip("ab", jobs):
        info = job_fields(job, nodes_env)
        logs[name] = log = open(tmp_path / f"{name}-{job}.out").read()
        assert (info["JobState"], info["ExitCode"], info["NodeList"]) == (
            "COMPLETED", "0:0", "h[0-1]"), log[-4000:]
        assert "strategy=multi_worker num_replicas=2 workers=2 source=slurm" in log, log[-4000:]
        assert_same_weights(str(tmp_path / name), baseline)
    assert together > 0, "the two jobs never ran at the same time"
    # Rank 0 on h0 and rank 1 on h1, in two network stacks; Slurm's step spans both.
    where = dict(re.findall(r"where: rank=(\d) (host=\S+ netns=\S+ step_nodes=\S+)", logs["a"]))
    assert sorted(where) == ["0", "1"], logs["a"][-4000:]
    assert [where[r].split()[0] for r in "01"] == ["host=h0", "host=h1"], where
    assert where["0"].split()[1] != where["1"].split()[1], where
    assert all(w.endswith("step_nodes=h[0-1]") for w in where.values()), where


def test_horovod_job_spans_two_nodes_and_equals_one_replica(nodes_env, baseline, tmp_path):
    hvd_python = os.path.join(VENV, "bin", "python")
    if not os.access(os.path.join(VENV, "bin", "horovodrun"), os.X_OK):
        _skip_or_fail(f"no Horovod venv at {VENV} (TFDIST_HOROVOD_VENV): run "
                      "scripts/install_horovod.sh")
    model_dir, out = str(tmp_path / "model"), str(tmp_path / "job-%j.out")
    # The batch shell runs on h0; horovodrun -H h0:1,h1:1 starts h1's rank over ssh.
    job, proc = sbatch("horovod.sbatch", out, "digits_mlp", *ARGS, "--model-dir", model_dir,
                       opts=["-N", "2", "--ntasks-per-node=1"],
                       env={**nodes_env, "HOROVOD_PYTHON": hvd_python})
    assert proc.returncode == 0 and job, tail(proc)
    wait_all([job], nodes_env)
    log = open(out.replace("%j", job)).read()
    assert job_fields(job, nodes_env)["ExitCode"] == "0:0", log[-4000:]
    assert "num_replicas=2 workers=2 source=horovod" in log, log[-4000:]
    assert job_fields(job, nodes_env)["NodeList"] == "h[0-1]"
    assert_same_weights(model_dir, baseline)


def test_nodes_min_max_job_losing_a_node_is_requeued_onto_the_other_and_resumes(
        nodes_env, baseline, tmp_path):
    # `--nodes=1-2`: Slurm gives the job both nodes while it can, and a requeued job
    # whatever is left of that range. slow_digits (digits_mlp slowed per example) lets
    # the node go down mid-run. The script's 2 tasks (workers) run wherever the nodes are.
    model_dir, out = str(tmp_path / "model"), str(tmp_path / "job-%j.out")
    recipe = os.path.join(WORKERS, "slow_digits.py")
    job, proc = sbatch("multi_worker.sbatch", out, recipe, *ARGS, "--model-dir", model_dir,
                       "--save-every-steps", "4", "--example-delay-ms", "5",
                       opts=["--nodes=1-2"], env=nodes_env)
    assert proc.returncode == 0 and job, tail(proc)
    wait_for_checkpoint(model_dir, what=f"job {job}")
    assert job_fields(job, nodes_env)["NodeList"] == "h[0-1]"
    try:
        # DOWN kills the job's tasks there and requeues it (--requeue); DRAIN keeps the
        # node out until the end of the test (a DOWN node may return when its slurmd answers).
        for state in ("down", "drain"):
            subprocess.run(["scontrol", "update", "nodename=h1", f"state={state}",
                            "reason=tfdist elastic test"], check=True, env=nodes_env)
        wait_all([job], nodes_env, timeout=400)
    finally:
        subprocess.run(["scontrol", "update", "nodename=h1", "state=resume"], env=nodes_env)
    info, log = job_fields(job, nodes_env), open(out.replace("%j", job)).read()
    assert (info["JobState"], info["ExitCode"], info["NodeList"]) == (
        "COMPLETED", "0:0", "h0"), log[-4000:]
    assert int(info["Restarts"]) >= 1, info
    assert f"tfdist-slurm: job {job} run 1 on h[0-1]," in log, log[-4000:]
    assert re.search(rf"tfdist-slurm: job {job} run \d on h0, 2 task\(s\)", log), log[-4000:]
    step = int(re.findall(r"resumed from \S+: epoch \d, step \d+ of 22 \(global step (\d+)\)",
                          log)[-1])
    assert 0 < step < 44, log[-4000:]
    assert_same_weights(model_dir, baseline)
