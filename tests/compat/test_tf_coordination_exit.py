"""tensorflow/tensorflow#58434: a task that outlives the coordination-service leader logs StartAbort.

Upstream: two MultiWorkerMirrored workers, the leader (worker 0) exiting
while worker 1 still has 3 s to go: worker 1's next heartbeat fails and
TensorFlow logs "E0000 ... BaseCollectiveExecutor::StartAbort". Through
`tf_coordination_exit.leave` the leader waits until worker 1 is gone, and
nothing is logged.
"""

import json
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO, WORKERS, clean_env
from tfdist.cluster.base import ClusterInfo
from tfdist.cluster.tf_config import info_from_tf_config
from tfdist.compat.tf_coordination_exit import peers
from tfdist.launch import free_ports

TWO = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
CHIEF = {"chief": ["c:1"], "worker": ["w:1", "w:2"]}


@pytest.mark.parametrize("cluster, task, expected", [
    (TWO, ("worker", 0), (True, ["127.0.0.1:2"])),
    (TWO, ("worker", 1), (False, ["127.0.0.1:1"])),
    (CHIEF, ("chief", 0), (True, ["w:1", "w:2"])),
    (CHIEF, ("worker", 0), (False, ["c:1", "w:2"])),
    ({"worker": ["w:1"]}, ("worker", 0), None),  # one task
    ({"chief": ["c:1"], "worker": ["w:1"], "ps": ["p:1"]}, ("chief", 0), None),
])
def test_peers(cluster, task, expected):
    info = info_from_tf_config({"cluster": cluster, "task": {"type": task[0], "index": task[1]}})
    assert peers(info) == expected


def test_peers_of_a_process_without_a_cluster():
    assert peers(ClusterInfo(source="local", num_workers=1, worker_index=0)) is None


def _pair(mode: str, linger_s: float) -> list[subprocess.Popen]:
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    return [subprocess.Popen(
        [sys.executable, f"{WORKERS}/coordination_exit.py", mode, str(linger_s)], cwd=REPO,
        env=clean_env(TF_CONFIG=json.dumps({"cluster": cluster,
                                            "task": {"type": "worker", "index": i}})),
        text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(2)]


@pytest.mark.integration
def test_leader_exiting_first_makes_the_other_task_log_startabort_unless_ordered():
    linger_s = 3.0
    runs = {mode: _pair(mode, linger_s) for mode in ("upstream", "ordered")}  # side by side
    out = {mode: [p.communicate(timeout=120) for p in procs] for mode, procs in runs.items()}
    for mode, procs in runs.items():
        for p, (stdout, stderr) in zip(procs, out[mode]):
            assert p.returncode == 0 and "SUM 2.0" in stdout, (mode, stdout, stderr[-2000:])
    aborts = {mode: [len(re.findall(r"StartAbort", stderr)) for _, stderr in out[mode]]
              for mode in out}
    # Upstream: worker 1, alive after the leader, aborts its collectives (logs it).
    assert aborts["upstream"][1] >= 1, out["upstream"][1][1][-2000:]
    # Ordered: nobody does, and the leader left only after worker 1 (about linger_s later).
    assert aborts["ordered"] == [0, 0], out["ordered"]
    waited = float(out["ordered"][0][0].split("LEFT_AFTER ")[1].split()[0])
    assert linger_s - 1.0 < waited < linger_s + 8.0, out["ordered"][0]
    assert "LEFT_AFTER" not in out["ordered"][1][0]  # worker 1 exited inside leave
