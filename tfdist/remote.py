"""Workers on other hosts over ssh, for `python -m tfdist.launch --hosts h0:2,h1:2`.

Like horovodrun: the launcher runs `ssh HOST 'cd CWD && env K=V ... CMD'` once
per worker, so each remote worker gets the launcher's working directory and
the variables in FORWARDED_ENV (plus `-x NAME`), its TF_CONFIG included.

Each remote command runs under a small watchdog (WATCHDOG, standard library
only) that ties the worker to its ssh session: the launcher forwards a signal
by writing its name ("TERM", "INT", "KILL") on the session's stdin, and when
stdin closes (the launcher died, or sshd dropped a session whose client went
silent) the worker's whole process group is stopped. So no worker outlives
its launcher on any host. Imports no TensorFlow.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time

from tfdist.errors import ClusterError, ConfigError

# What a remote worker needs of the launcher's environment; ssh passes none of it.
FORWARDED_ENV = ("TF_CONFIG", "PATH", "PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONHASHSEED", "LD_LIBRARY_PATH",
                 "VIRTUAL_ENV", "TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS",
                 "TF_DETERMINISTIC_OPS", "KERAS_BACKEND", "OMP_NUM_THREADS",
                 "CUDA_VISIBLE_DEVICES")
FORWARDED_PREFIXES = ("TFDIST_",)
# A silent peer drops the session after 3 x 5 s; the watchdog then stops the worker.
SSH_OPTIONS = ["-T", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=5",
               "-o", "ServerAliveCountMax=3"]
WATCHDOG_GRACE_S = 10.0
CONNECT_TIMEOUT_S = 5  # for `unreachable`: the TCP connect and ssh banner of a live host
SSH_FAILED = 255  # ssh's own status: could not connect, or the connection was lost

# Runs on the remote host as `python -c WATCHDOG CMD...`. Exits with CMD's
# status, or 128+N when CMD died of signal N (a shell's convention).
WATCHDOG = f"""
import os, signal, subprocess, sys, threading
p = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, start_new_session=True)
def send(sig):
    try:
        os.killpg(p.pid, sig)
    except OSError:
        pass
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, lambda n, f: send(signal.SIGTERM if n == signal.SIGHUP else n))
def watch():
    for line in sys.stdin:
        name = line.strip()
        if name in ("INT", "TERM", "KILL"):
            send(getattr(signal, "SIG" + name))
    send(signal.SIGTERM)
    try:
        p.wait({WATCHDOG_GRACE_S})
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
threading.Thread(target=watch, daemon=True).start()
rc = p.wait()
send(signal.SIGKILL)
# os._exit: a normal exit would race the reader thread for stdin's lock and
# can abort (CPython: "could not acquire lock for <stdin> at interpreter shutdown").
os._exit(128 - rc if rc < 0 else rc)
"""

# Prints N ports free on ADDRESS (run remotely, so they are free where the worker binds).
PORT_PROBE = """
import socket, sys
n, host = int(sys.argv[1]), sys.argv[2]
socks = [socket.socket() for _ in range(n)]
for s in socks:
    s.bind((host, 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
"""

_HOST_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


def parse_hosts(text: str) -> list[tuple[str, int]]:
    """Pure: 'h0:2,h1:2' -> [('h0', 2), ('h1', 2)]; a host without ':N' has 1 slot.

    Raises:
        ConfigError: saying what was received.
    """
    out: list[tuple[str, int]] = []
    for item in (text or "").split(","):
        name, colon, slots = item.strip().partition(":")
        if not name or not _HOST_RE.match(name) or (colon and not slots.isdigit()):
            raise ConfigError(f"--hosts takes HOST[:SLOTS],... like h0:2,h1:2. Received: "
                              f"{text!r} (bad item {item!r}).")
        n = int(slots) if slots else 1
        if n < 1:
            raise ConfigError(f"--hosts: each host needs at least 1 slot. Received: {item!r}.")
        if name in (h for h, _ in out):
            raise ConfigError(f"--hosts lists {name!r} twice. Received: {text!r}; give each "
                              "host once with its number of slots (h0:2).")
        out.append((name, n))
    return out


def place(num_tasks: int, hosts: list[tuple[str, int]]) -> list[str]:
    """Pure: the host of each of `num_tasks` tasks, filling each host's slots in order.

    Raises:
        ConfigError: when the hosts have fewer slots than tasks.
    """
    slots = [h for h, n in hosts for _ in range(n)]
    if num_tasks > len(slots):
        raise ConfigError(f"{num_tasks} tasks do not fit in the {len(slots)} slot(s) of --hosts "
                          f"{','.join(f'{h}:{n}' for h, n in hosts)}; add hosts or slots.")
    return slots[:num_tasks]


def without(hosts: list[tuple[str, int]], gone: set[str] | frozenset = frozenset(),
            one_slot_of: str | None = None) -> list[tuple[str, int]]:
    """Pure: `hosts` less the hosts in `gone` and less one slot of `one_slot_of`.

    A host left with no slot is left out: [('h0', 1), ('h1', 1)] without one
    slot of 'h1' is [('h0', 1)].
    """
    out = []
    for h, n in hosts:
        n = 0 if h in gone else n - (h == one_slot_of)
        if n > 0:
            out.append((h, n))
    return out


def forwarded_env(env: dict, extra: tuple[str, ...] = ()) -> dict:
    """Pure: the part of `env` a remote worker gets (FORWARDED_ENV, TFDIST_*, `extra`)."""
    return {k: v for k, v in env.items()
            if k in FORWARDED_ENV or k in extra or k.startswith(FORWARDED_PREFIXES)}


def remote_command(argv: list[str], env: dict, cwd: str, python: str) -> str:
    """Pure: the shell line ssh runs: cd, then `env K=V ... python -c WATCHDOG argv`."""
    assigns = [shlex.quote(f"{k}={v}") for k, v in sorted(env.items())]
    run = ["exec", "env", *assigns, shlex.quote(python), "-c", shlex.quote(WATCHDOG),
           *map(shlex.quote, argv)]
    return (f"cd {shlex.quote(cwd)} || {{ echo 'tfdist.launch: no directory {cwd} on this "
            f"host' >&2; exit 2; }}; " + " ".join(run))


def ssh_base(ssh_config: str | None) -> list[str]:
    """`ssh [-F CONFIG] <options>`: the command every remote call starts with."""
    return ["ssh", *(["-F", ssh_config] if ssh_config else []), *SSH_OPTIONS]


def resolve(host: str, ssh_config: str | None) -> str:
    """The address `host` has for ssh (its HostName in the ssh config), as an IP.

    Raises:
        ClusterError: when it cannot be resolved.
    """
    config = ["-F", ssh_config] if ssh_config else []
    proc = subprocess.run(["ssh", *config, "-G", host], capture_output=True, text=True,
                          timeout=30)
    name = host
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key == "hostname" and value:
            name = value.strip()
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        pass
    try:
        return socket.gethostbyname(name)
    except OSError as e:
        raise ClusterError(f"cannot resolve host {host!r} (ssh HostName {name!r}): {e}.\n"
                           "HINT: list it in /etc/hosts or in the ssh config "
                           "(--ssh-config).") from None


def probe_ports(host: str, address: str, n: int, ssh_config: str | None, python: str,
                timeout_s: float = 60.0) -> list[int]:
    """`n` ports free on `host` at `address`, asked over ssh (which also proves ssh works).

    Raises:
        ClusterError: when ssh fails, naming the host and what ssh said.
    """
    cmd = [*ssh_base(ssh_config), host, shlex.join([python, "-c", PORT_PROBE, str(n), address])]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"ssh to {host} ({address}) did not answer in {timeout_s:g}s.\n"
                           "HINT: is the host up and its link plugged in?") from None
    ports = proc.stdout.split()
    if proc.returncode != 0 or len(ports) != n or not all(p.isdigit() for p in ports):
        raise ClusterError(
            f"cannot start workers on {host} ({address}) over ssh: `{shlex.join(cmd[:-1])} ...` "
            f"exited {proc.returncode}: {proc.stderr.strip()[-500:] or proc.stdout[-200:]}\n"
            "HINT: `ssh HOST true` must work without a password (for namespaced hosts, "
            "python -m tfdist.hosts up N and --ssh-config from `python -m tfdist.hosts "
            "ssh-config`).")
    return [int(p) for p in ports]


def unreachable(hosts: list[str], ssh_config: str | None,
                timeout_s: float = 15.0) -> dict[str, str]:
    """The hosts among `hosts` that do not answer `ssh HOST true` in `timeout_s`, asked
    in parallel: {host: why} (a pulled cable, a host that is down, sshd gone).

    A host that answers is left out, whatever its workers did.
    """
    # ConnectTimeout: a host whose cable is out never answers the TCP connect,
    # and that is known in seconds; a slow but live host still has timeout_s.
    connect = ["-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}"]
    procs = {h: subprocess.Popen([*ssh_base(ssh_config), *connect, h, "true"],
                                 stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for h in hosts}
    deadline, out = time.monotonic() + timeout_s, {}
    for h, p in procs.items():
        try:
            _, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            out[h] = f"no answer over ssh in {timeout_s:g}s"
            continue
        if p.returncode != 0:
            out[h] = f"ssh exited {p.returncode}: {err.strip()[-200:]}"
    return out


def forward_signal(stdin, sig) -> None:
    """Asks a WATCHDOG session to pass `sig` to its worker: the name on the session's stdin.

    A session that already ended is no error (the worker is gone).
    """
    try:
        stdin.write(f"{signal.Signals(sig).name[3:]}\n".encode())
        stdin.flush()
    except (OSError, ValueError):  # BrokenPipeError is an OSError; ValueError: closed
        pass


def shell_status(returncode: int) -> int:
    """Pure function: a Popen return code as a shell reports it (signal N as 128+N)."""
    return 128 - returncode if returncode < 0 else returncode


class RemoteProcess(subprocess.Popen):
    """An ssh session running one worker under WATCHDOG; behaves like its Popen.

    `send_signal` forwards the signal through the session's stdin; the
    return code is the remote worker's (negative for a signal, as for a
    local Popen), or 255 when ssh itself failed or lost the connection.
    """

    def __init__(self, host: str, argv: list[str], env: dict, cwd: str,
                 ssh_config: str | None, python: str = sys.executable, **kwargs):
        self.host = host
        line = remote_command(argv, env, cwd, python)
        super().__init__([*ssh_base(ssh_config), host, line], stdin=subprocess.PIPE, **kwargs)
        self._translated = False

    def _translate(self) -> None:
        rc = self.returncode
        if rc is not None and not self._translated:
            self._translated = True
            if 128 < rc < 128 + 64:
                self.returncode = -(rc - 128)

    def poll(self):
        super().poll()
        self._translate()
        return self.returncode

    def wait(self, timeout=None):
        super().wait(timeout)
        self._translate()
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is not None:
            return
        forward_signal(self.stdin, sig)

    def kill(self):
        """Kills the remote worker if reachable, then the local ssh."""
        self.send_signal(signal.SIGKILL)
        try:
            super().wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        if super().poll() is None:
            os.kill(self.pid, signal.SIGKILL)

