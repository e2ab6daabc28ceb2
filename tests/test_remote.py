"""tfdist.remote: --hosts parsing, placement, and the remote command run locally (no ssh)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tfdist import remote
from tfdist.errors import ConfigError


def test_parse_hosts():
    assert remote.parse_hosts("h0:2,h1:2") == [("h0", 2), ("h1", 2)]
    assert remote.parse_hosts("node-a.example,node-b:3") == [("node-a.example", 1), ("node-b", 3)]
    for bad, match in (("", "bad item ''"), ("h0:", "h0:"), ("h0:0", "at least 1 slot"),
                       ("h0:two", "h0:two"), ("h0,h0", "twice"), ("a b:1", "a b:1")):
        with pytest.raises(ConfigError, match=match):
            remote.parse_hosts(bad)


def test_place_fills_slots_in_order():
    hosts = [("h0", 2), ("h1", 1)]
    assert remote.place(3, hosts) == ["h0", "h0", "h1"]
    assert remote.place(1, hosts) == ["h0"]
    with pytest.raises(ConfigError, match="4 tasks do not fit in the 3 slot"):
        remote.place(4, hosts)


def test_without_drops_lost_hosts_and_one_slot():
    hosts = [("h0", 2), ("h1", 1), ("h2", 1)]
    assert remote.without(hosts, {"h1"}) == [("h0", 2), ("h2", 1)]
    assert remote.without(hosts, one_slot_of="h0") == [("h0", 1), ("h1", 1), ("h2", 1)]
    assert remote.without(hosts, one_slot_of="h2") == [("h0", 2), ("h1", 1)]
    assert remote.without(hosts, {"h0", "h2"}, one_slot_of="h1") == []


def test_forwarded_env_keeps_what_workers_need_only():
    env = {"PATH": "/bin", "PYTHONPATH": "/src", "TF_CONFIG": "{}", "TFDIST_X": "1",
           "HOME": "/root", "SSH_AUTH_SOCK": "/tmp/a", "MINE": "m"}
    assert remote.forwarded_env(env) == {"PATH": "/bin", "PYTHONPATH": "/src", "TF_CONFIG": "{}",
                                         "TFDIST_X": "1"}
    assert remote.forwarded_env(env, ("MINE",))["MINE"] == "m"


def _run_locally(argv, env, cwd):
    """The line ssh would hand to the remote shell, run by a local shell.

    Its stdin stays open (as the launcher keeps the ssh session's): closing
    it means the session ended, which stops the worker.
    """
    line = remote.remote_command(argv, env, cwd, sys.executable)
    return subprocess.Popen(["sh", "-c", line], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(p):
    """(stdout, stderr) once the worker exits on its own, stdin still open."""
    out, err = p.stdout.read(), p.stderr.read()
    p.wait(timeout=60)
    p.stdin.close()
    return out, err


@pytest.mark.integration
def test_remote_command_sets_cwd_and_env_and_quotes_everything(tmp_path):
    code = "import os, sys; print(os.getcwd(), os.environ['A'], os.environ.get('HOME'), sys.argv[1:])"
    p = _run_locally([sys.executable, "-c", code, "it's", "$HOME", "a b"],
                     {"A": "x y 'z'", "PATH": os.environ["PATH"]}, str(tmp_path))
    out, err = _finish(p)
    assert p.returncode == 0, err
    assert out == f"{tmp_path} x y 'z' {os.environ.get('HOME')} [\"it's\", '$HOME', 'a b']\n"


@pytest.mark.integration
def test_remote_command_fails_clearly_without_the_directory(tmp_path):
    p = _run_locally(["true"], {}, str(tmp_path / "missing"))
    _, err = _finish(p)
    assert p.returncode == 2 and "no directory" in err


@pytest.mark.integration
def test_exit_status_and_signal_death_come_back():
    p = _run_locally([sys.executable, "-c", "import sys; sys.exit(7)"], {}, "/")
    _finish(p)
    assert p.returncode == 7
    p = _run_locally([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), 9)"], {}, "/")
    _finish(p)
    assert p.returncode == 128 + 9


def _started(p):
    line = p.stdout.readline()
    assert line == "ready\n", p.stderr.read()


@pytest.mark.integration
def test_signal_names_on_stdin_are_forwarded():
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGINT, lambda n, f: (print('INT', flush=True), sys.exit(3)))\n"
            "print('ready', flush=True); time.sleep(60)\n")
    p = _run_locally([sys.executable, "-c", code], {}, "/")
    _started(p)
    p.stdin.write("INT\n")
    p.stdin.flush()
    out, _ = _finish(p)
    assert out == "INT\n" and p.returncode == 3


def test_forward_signal_writes_the_name_and_shell_status_maps_signals():
    import io
    import signal

    buf = io.BytesIO()
    remote.forward_signal(buf, signal.SIGTERM)
    remote.forward_signal(buf, signal.SIGINT)
    assert buf.getvalue() == b"TERM\nINT\n"
    buf.close()
    remote.forward_signal(buf, signal.SIGTERM)  # an ended session is no error
    assert [remote.shell_status(rc) for rc in (0, 4, -15, -9)] == [0, 4, 143, 137]


@pytest.mark.integration
def test_closed_stdin_stops_the_worker_and_its_children(tmp_path):
    pidfile = tmp_path / "child"
    code = ("import subprocess, sys, time\n"
            f"c = subprocess.Popen(['sleep', '60']); open({str(pidfile)!r}, 'w').write(str(c.pid))\n"
            "print('ready', flush=True); time.sleep(60)\n")
    p = _run_locally([sys.executable, "-c", code], {}, "/")
    _started(p)
    child = int(pidfile.read_text())
    start = time.monotonic()
    p.stdin.close()  # the ssh session ended
    p.wait(timeout=30)
    assert time.monotonic() - start < 20
    assert p.returncode == 128 + 15  # SIGTERM
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{child}") and _state(child) != "Z":
        assert time.monotonic() < deadline, "the worker's child outlived it"
        time.sleep(0.05)


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
