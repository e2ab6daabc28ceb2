"""`tfdist.launch --hosts` with plain Python workers on real namespaced hosts (no TensorFlow).

Each worker runs on its host over ssh: its TF_CONFIG names every host's
address, it gets the launcher's cwd and environment, signals reach it, and it
never outlives the launcher on any host. Needs root and namespaces (skips
saying why; fails under CI).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, clean_env, namespaced_hosts, tail
from tfdist import exit_codes

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def hosts():
    with namespaced_hosts(2) as cluster:
        yield cluster


def _launch_argv(cluster, spec, code, *launch_args):
    return [sys.executable, "-m", "tfdist.launch", "--hosts", spec, "--ssh-config",
            cluster.ssh_config, "--timeout", "120", *launch_args, "--", sys.executable, "-c", code]


def _launch(cluster, spec, code, *launch_args, env=None, timeout=150):
    return subprocess.run(_launch_argv(cluster, spec, code, *launch_args), capture_output=True,
                          text=True, timeout=timeout, env=env or clean_env(), cwd=REPO)


def _wait_no_processes(cluster, timeout_s=40.0):
    """Polls until no host runs anything but its sshd; returns what is left then."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = {h.name: cluster.processes(h.name) for h in cluster.hosts}
        # An sshd session child may linger a moment after its command ended.
        left = {h: [p for p in ps if "sshd:" not in p] for h, ps in left.items()}
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def test_workers_run_on_their_hosts_with_the_launchers_cwd_and_env(hosts, tmp_path):
    code = ("import os, json, socket; c = json.loads(os.environ['TF_CONFIG']); "
            "print(json.dumps({'host': socket.gethostname(), 'task': c['task'], "
            "'cluster': c['cluster'], 'cwd': os.getcwd(), 'pp': os.environ.get('PYTHONPATH'), "
            "'log': os.environ.get('TF_CPP_MIN_LOG_LEVEL'), 'x': os.environ.get('MY_FLAG')}))")
    env = clean_env(MY_FLAG="42", NOT_FORWARDED="1")
    proc = _launch(hosts, "h0:2,h1:1", code, "-x", "MY_FLAG", env=env)
    assert proc.returncode == 0, tail(proc)
    seen = {}
    for line in proc.stdout.splitlines():
        label, _, rest = line.partition("] ")
        seen[label.strip("[")] = json.loads(rest)
    assert sorted(seen) == ["worker 0@h0", "worker 1@h0", "worker 2@h1"]
    a0, a1 = hosts.address("h0"), hosts.address("h1")
    workers = seen["worker 0@h0"]["cluster"]["worker"]
    assert [w.rpartition(":")[0] for w in workers] == [a0, a0, a1]
    assert len(set(workers)) == 3
    for label, info in seen.items():
        assert info["host"] == label.split("@")[1]
        assert info["task"]["index"] == int(label.split()[1].split("@")[0])
        assert info["cluster"]["worker"] == workers
        assert info["cwd"] == REPO and info["pp"] == env["PYTHONPATH"]
        assert info["log"] == "2" and info["x"] == "42"
    assert _wait_no_processes(hosts, 10) == {"h0": [], "h1": []}


def test_a_failed_worker_stops_the_others_on_every_host(hosts):
    code = ("import os, json, sys, time; i = json.loads(os.environ['TF_CONFIG'])['task']['index']; "
            "print('up', flush=True); sys.exit(7) if i == 2 else time.sleep(300)")
    start = time.monotonic()
    proc = _launch(hosts, "h0:2,h1:1", code)
    assert proc.returncode == 1, tail(proc)
    assert time.monotonic() - start < 100
    assert (f"tfdist.launch: worker 2 on h1 ({hosts.address('h1')}) failed (exit code 7); "
            "stopping the other 2 worker(s).") in proc.stderr
    assert _wait_no_processes(hosts) == {"h0": [], "h1": []}


def test_signals_are_forwarded_to_remote_workers(hosts):
    code = ("import signal, sys, time, socket\n"
            "def stop(n, f):\n"
            "    print('got', signal.Signals(n).name, 'on', socket.gethostname(), flush=True)\n"
            "    sys.exit(75)\n"
            "signal.signal(signal.SIGTERM, stop)\n"
            "print('ready', flush=True)\n"
            "time.sleep(300)\n")
    p = subprocess.Popen(_launch_argv(hosts, "h0:1,h1:1", code), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=clean_env(), cwd=REPO)
    try:
        ready = 0
        while ready < 2:
            line = p.stdout.readline()
            assert line, p.stderr.read()
            ready += line.endswith("ready\n")
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == exit_codes.PREEMPTED, err
    assert "[worker 0@h0] got SIGTERM on h0" in out and "[worker 1@h1] got SIGTERM on h1" in out
    assert _wait_no_processes(hosts, 10) == {"h0": [], "h1": []}


def test_remote_workers_die_with_their_launcher(hosts):
    code = "import time; print('ready', flush=True); time.sleep(300)"
    p = subprocess.Popen(_launch_argv(hosts, "h0:1,h1:1", code), stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, env=clean_env(), cwd=REPO)
    try:
        for _ in range(2):
            assert p.stdout.readline().endswith("ready\n")
        for h in ("h0", "h1"):
            assert any("time.sleep(300)" in line for line in hosts.processes(h)), h
        p.kill()  # SIGKILL: the launcher cannot stop anything itself
        p.wait()
    finally:
        if p.poll() is None:
            p.kill()
    assert _wait_no_processes(hosts, 30) == {"h0": [], "h1": []}


def test_bad_hosts_are_refused_before_anything_starts(hosts):
    proc = _launch(hosts, "h0:2,h1:x", "print(1)")
    assert proc.returncode == 2 and "Received: 'h0:2,h1:x'" in proc.stderr
    proc = _launch(hosts, "h0:1,h0:1", "print(1)")
    assert proc.returncode == 2 and "lists 'h0' twice" in proc.stderr
    proc = _launch(hosts, "h0:1,h1:1", "print(1)", "-n", "2")
    assert proc.returncode == 2 and "-n N is for workers on this machine" in proc.stderr
    proc = _launch(hosts, "h0:1", "print(1)", "--ps", "1", "--workers", "2")
    assert proc.returncode == 2 and "4 tasks do not fit in the 1 slot(s)" in proc.stderr
    proc = _launch(hosts, "h0:1,h7:1", "print(1)")
    assert proc.returncode == exit_codes.CLUSTER, tail(proc)
    assert "h7" in proc.stderr and "HINT" in proc.stderr
