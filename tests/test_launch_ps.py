"""`tfdist.launch --ps N --workers M`, with plain Python tasks (no TensorFlow)."""

import sys

import pytest

from tests.conftest import run_py

from tfdist import launch

# Each task prints its role, then behaves as ROLE_ACTIONS says (default: sleep, like a server).
TASK = ("import json, os, sys, time; t = json.loads(os.environ['TF_CONFIG'])['task']; "
        "role = f\"{t['type']} {t['index']}\"; print('role', role, flush=True); "
        "actions = {ACTIONS}; a = actions.get(role, 'sleep'); "
        "time.sleep(float(a.split(':')[1])) if a.startswith('wait:') else None; "
        "sys.exit(int(a.split(':')[-1])) if a.startswith(('exit', 'wait')) else time.sleep(120)")


def _launch(actions, workers=2, ps=1, timeout=60):
    code = TASK.replace("{ACTIONS}", repr(actions))
    return run_py(["-m", "tfdist.launch", "--ps", str(ps), "--workers", str(workers), "--timeout",
                   "40", "--", sys.executable, "-c", code], timeout=timeout)


def test_ps_tf_configs_roles_and_addresses():
    configs = launch.ps_tf_configs(2, 1, [10, 11, 12, 13])
    assert [label for label, _ in configs] == ["chief", "worker 0", "worker 1", "ps 0"]
    cluster = {"chief": ["127.0.0.1:10"], "worker": ["127.0.0.1:11", "127.0.0.1:12"],
               "ps": ["127.0.0.1:13"]}
    assert configs[2][1] == {"cluster": cluster, "task": {"type": "worker", "index": 1}}
    assert configs[3][1]["task"] == {"type": "ps", "index": 0}


@pytest.mark.integration
def test_job_ends_with_the_chief_and_servers_are_stopped():
    proc = _launch({"chief 0": "wait:1:0"})
    assert proc.returncode == 0, proc.stderr
    for role in ("chief", "worker 0", "worker 1", "ps 0"):
        assert f"[{role}] role {role.replace('chief', 'chief 0')}" in proc.stdout


@pytest.mark.integration
def test_dead_worker_is_reported_and_the_job_goes_on():
    proc = _launch({"worker 1": "exit:9", "chief 0": "wait:3:0"})
    assert proc.returncode == 0, proc.stderr
    assert ("tfdist.launch: worker 1 exited (exit code 9); the coordinator re-runs its steps "
            "on the other workers and the job goes on.") in proc.stderr


@pytest.mark.integration
def test_dead_ps_and_failed_chief_fail_the_job():
    proc = _launch({"ps 0": "exit:1", "chief 0": "wait:2:3"})
    assert proc.returncode == 1
    assert "tfdist.launch: ps 0 exited (exit code 1); it held model variables" in proc.stderr
    assert "tfdist.launch: chief failed (exit code 3); stopping the servers." in proc.stderr


@pytest.mark.integration
def test_all_workers_gone_stops_the_job():
    proc = _launch({"worker 0": "exit:1", "worker 1": "exit:1"})
    assert proc.returncode == 1
    assert "all 2 worker(s) have exited; nothing is left to train on" in proc.stderr


@pytest.mark.integration
def test_ps_usage_errors():
    proc = run_py(["-m", "tfdist.launch", "--ps", "1", "--", "true"], timeout=30)
    assert proc.returncode == 2 and "--ps and --workers go together" in proc.stderr
    proc = run_py(["-m", "tfdist.launch", "-n", "2", "--ps", "1", "--workers", "2", "--",
                   "true"], timeout=30)
    assert proc.returncode == 2 and "use either -n N" in proc.stderr
    proc = run_py(["-m", "tfdist.launch", "--ps", "1", "--workers", "0", "--", "true"],
                  timeout=30)
    assert proc.returncode == 2 and "Received: --ps 1 --workers 0" in proc.stderr
