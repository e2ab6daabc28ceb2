"""`tfdist.hosts` on this machine: real namespaces, real sshd, real cables.

Needs root and network namespaces; without them the tests skip saying why
(under CI they fail).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest

from tests.conftest import REPO, clean_env, namespaced_hosts

pytestmark = pytest.mark.integration


def _hosts_cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "tfdist.hosts", *args], capture_output=True,
                          text=True, timeout=timeout, env=clean_env(), cwd=REPO)


def _live_sshd_for(state_dir):
    """Live (not zombie) sshd processes started with a config under `state_dir`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and "sshd" in cmd and state_dir in cmd:
            found.append(pid)
    return found


def test_hosts_resolve_and_reach_each_other_over_ssh():
    with namespaced_hosts(2) as c:
        a0, a1 = c.address("h0"), c.address("h1")
        assert a0 != a1 and a0.startswith("198.1")
        # Own hostname and own address on each host.
        for h, a in (("h0", a0), ("h1", a1)):
            out = c.exec(h, ["sh", "-c", "hostname; ip -o -4 addr show eth0"],
                         capture_output=True, text=True, timeout=30)
            assert out.returncode == 0, out.stderr
            assert out.stdout.splitlines()[0] == h
            assert f"{a}/24" in out.stdout
        # ssh from the root namespace, with the cluster's ssh_config.
        out = subprocess.run(c.ssh_command("h1", ["hostname"]), capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 0 and out.stdout.strip() == "h1", out.stderr
        # Plain ssh by name from a host to the other (their /etc/hosts and ssh_config).
        out = c.exec("h0", ["ssh", "h1", "hostname; cat /etc/hostname"], capture_output=True,
                     text=True, timeout=30)
        assert out.returncode == 0 and out.stdout.split() == ["h1", "h1"], out.stderr
        # sshd listens on the host's own address only.
        out = c.exec("h1", ["ss", "-Hltn"], capture_output=True, text=True, timeout=30)
        if out.returncode == 0:
            listening = [line.split()[3] for line in out.stdout.splitlines()]
            assert listening == [f"{a1}:22"], listening


def test_pulled_link_cuts_the_host_off_and_plugging_it_back_restores_it():
    with namespaced_hosts(2) as c:
        a1 = c.address("h1")
        ping = ["python3", "-c", "import socket,sys; socket.create_connection"
                f"(('{a1}', 22), timeout=2); print('ok')"]
        assert c.exec("h0", ping, capture_output=True, text=True, timeout=30).stdout == "ok\n"
        c.link("h1", up=False)
        assert c.status()["hosts"][1]["link"] == "down"
        out = c.exec("h0", ping, capture_output=True, text=True, timeout=30)
        assert out.returncode != 0 and "timed out" in out.stderr, out
        c.link("h1", up=True)
        assert c.status()["hosts"][1]["link"] == "up"
        assert c.exec("h0", ping, capture_output=True, text=True, timeout=30).stdout == "ok\n"


def test_cli_up_status_exec_down_leaves_nothing_behind():
    name = f"tc{os.getpid() % 100000}-{uuid.uuid4().hex[:6]}"
    state_dir = f"/run/tfdist-hosts/{name}"
    from tfdist.hosts import unavailable

    reason = unavailable()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs namespaced hosts: {reason}")
        pytest.skip(reason)
    try:
        up = _hosts_cli("--cluster", name, "up", "2", "--rate", "1gbit")
        assert up.returncode == 0, up.stderr
        again = _hosts_cli("--cluster", name, "up", "2")
        assert again.returncode == 3 and "exists already" in again.stderr
        st = json.loads(_hosts_cli("--cluster", name, "status", "--json").stdout)
        assert st["up"] and st["rate"] == "1gbit" and [h["name"] for h in st["hosts"]] == ["h0", "h1"]
        assert all(h["sshd_pid"] and h["link"] == "up" for h in st["hosts"])
        qdisc = _hosts_cli("--cluster", name, "exec", "h0", "--", "tc", "qdisc", "show", "dev", "eth0")
        assert "tbf" in qdisc.stdout and "rate 1Gbit" in qdisc.stdout, qdisc
        out = _hosts_cli("--cluster", name, "exec", "h1", "--", "hostname")
        assert out.returncode == 0 and out.stdout == "h1\n"
        out = _hosts_cli("exec", "h1", "--cluster", name, "--", "sh", "-c", "exit 7")
        assert out.returncode == 7
        cfg = _hosts_cli("--cluster", name, "ssh-config").stdout.strip()
        out = subprocess.run(["ssh", "-F", cfg, "h0", "hostname"], capture_output=True,
                             text=True, timeout=30)
        assert out.stdout == "h0\n", out.stderr
        bad = _hosts_cli("--cluster", name, "exec", "h9", "--", "true")
        assert bad.returncode == 2 and "no host 'h9'" in bad.stderr
        assert _live_sshd_for(state_dir)
    finally:
        down = _hosts_cli("--cluster", name, "down")
    assert down.returncode == 0, down.stderr
    assert _hosts_cli("--cluster", name, "down").returncode == 0  # idempotent
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"{name}-h" not in netns
    assert not os.path.exists(state_dir) and not os.path.exists(f"/etc/netns/{name}-h0")
    assert _live_sshd_for(state_dir) == []
    st = _hosts_cli("--cluster", name, "status")
    assert st.returncode == 0 and "not up" in st.stdout


def test_two_clusters_coexist_on_separate_subnets():
    with namespaced_hosts(1) as a, namespaced_hosts(1) as b:
        sa, sb = a.status()["subnet"], b.status()["subnet"]
        assert sa != sb
        for c in (a, b):
            out = subprocess.run(c.ssh_command("h0", ["hostname"]), capture_output=True,
                                 text=True, timeout=30)
            assert out.stdout == "h0\n", out.stderr


def test_refuses_clearly_without_root():
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to drop to an unprivileged user")
    out = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups",
                          sys.executable, "-m", "tfdist.hosts", "--cluster", "tnoroot", "up", "1"],
                         capture_output=True, text=True, timeout=60, env=clean_env(), cwd="/")
    assert out.returncode == 3, out
    assert "needs root" in out.stderr and "HINT" in out.stderr
