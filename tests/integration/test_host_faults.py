"""Real processes on three namespaced hosts (tfdist.hosts) whose one host is lost for good.

* Parameter server: chief and worker 0 on h0, worker 1 on h1, the ps on h2;
  h1's cable is pulled mid-training and stays out. The coordinator re-runs
  worker 1's steps on worker 0, finishes every epoch, writes its model and
  metrics naming the lost worker, and nothing is left on any host.

Needs root and namespaces (skips saying why; fails under CI).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, clean_env, namespaced_hosts
from tests.integration.test_multi_host import _wait_no_processes

pytestmark = pytest.mark.integration

PS_EPOCHS = 6
PS_ARGS = ["digits_mlp", "--epochs", str(PS_EPOCHS), "--seed", "0", "--global-batch-size", "64",
           "--learning-rate", "0.1", "--verbose", "0", "--threads", "1",
           # Worker 0 a little slower, so worker 1 holds steps when its cable goes.
           "--straggler-delay-ms", "20", "--straggler-worker", "0"]
STEPS_PER_EPOCH = 1437 // 64  # digits_mlp's training split at batch 64


@pytest.fixture(scope="module")
def hosts():
    with namespaced_hosts(3, prefix="hf") as cluster:
        yield cluster


def _read(path) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def test_parameter_server_finishes_without_a_worker_whose_link_is_pulled(hosts, tmp_path):
    model_dir, log_path = str(tmp_path / "model"), tmp_path / "out.txt"
    argv = [sys.executable, "-m", "tfdist.launch", "--ps", "1", "--workers", "2", "--hosts",
            "h0:2,h1:1,h2:1", "--ssh-config", hosts.ssh_config, "--timeout", "300", "--",
            sys.executable, "-m", "tfdist.train", *PS_ARGS, "--strategy", "parameter_server",
            "--model-dir", model_dir]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, cwd=REPO, env=clean_env(), stdout=log,
                                stderr=subprocess.STDOUT)
    pulled = None
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if pulled is None and "[chief@h0] tfdist: epoch 1/" in _read(log_path):
                hosts.link("h1", up=False)
                pulled = time.monotonic()
            time.sleep(0.2)
        rc = proc.wait(timeout=max(1, deadline - time.monotonic()))
        finished_s = time.monotonic() - pulled if pulled else None
        left = _wait_no_processes(hosts, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        hosts.link("h1", up=True)
    text = _read(log_path)
    assert pulled is not None, text[-3000:]
    print(f"h1's link pulled after epoch 1: the launcher ended {finished_s:.1f}s later")
    assert rc == 0, text[-5000:]
    a1 = hosts.address("h1")
    assert f"[chief@h0] tfdist: epoch {PS_EPOCHS}/{PS_EPOCHS}" in text, text[-3000:]
    assert f"[chief@h0] tfdist: finished without lost worker(s) [1]: worker 1 ({a1}:" in text
    with open(os.path.join(model_dir, "metrics.json"), encoding="utf-8") as f:
        metrics = json.load(f)
    # Every scheduled step ran; worker 0 took over h1's.
    assert sum(metrics["steps_per_worker"]) == metrics["steps"] == PS_EPOCHS * STEPS_PER_EPOCH
    assert [(w["worker"], w["address"].rpartition(":")[0]) for w in metrics["lost_workers"]] == [
        (1, a1)], metrics["lost_workers"]
    assert metrics["steps_per_worker"][0] > metrics["steps_per_worker"][1]
    assert metrics["test"]["accuracy"] > 0.7
    assert os.path.exists(os.path.join(model_dir, "model.keras"))
    assert left == {"h0": [], "h1": [], "h2": []}, left
