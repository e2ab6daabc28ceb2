"""`HostRig`: build, inspect and remove a namespaced test cluster of hosts (needs root).

Every system change goes through `_sh` (ip, tc, ssh-keygen, sshd), so what
`up` does and what `down` undoes can be read side by side.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import time

from tfdist.errors import ClusterError
from tfdist.hosts import plan as planlib

STATE_ROOT = "/run/tfdist-hosts"
NETNS_ETC = "/etc/netns"
SSHD = "/usr/sbin/sshd"
_HINT = ("HINT: tfdist.hosts needs root (or CAP_NET_ADMIN + CAP_SYS_ADMIN), iproute2 and a "
         "kernel with network namespaces; in a container, run it with --privileged.")


class HostsError(ClusterError):
    """A namespaced cluster cannot be built or used; the message says why and what to do."""


def _sh(args: list[str], check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """Runs a system command; a failure is a HostsError quoting the command and its stderr."""
    proc = subprocess.run(args, capture_output=True, text=True, **kwargs)
    if check and proc.returncode != 0:
        raise HostsError(f"`{' '.join(args)}` failed (exit {proc.returncode}): "
                         f"{proc.stderr.strip()[-800:]}")
    return proc


def unavailable() -> str | None:
    """Why namespaced clusters cannot be made here, or None when they can.

    Tests skip with this reason (and fail under CI).
    """
    if os.geteuid() != 0:
        return f"tfdist.hosts needs root; running as uid {os.geteuid()}. {_HINT}"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (apt-get install iproute2 util-linux). {_HINT}"
    probe = f"tfdist-probe{os.getpid()}"
    proc = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if proc.returncode != 0:
        return f"cannot create a network namespace: {proc.stderr.strip()}. {_HINT}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@contextlib.contextmanager
def _global_lock():
    """Serializes subnet allocation and package installs across processes."""
    os.makedirs(STATE_ROOT, exist_ok=True)
    with open(os.path.join(STATE_ROOT, ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_sshd() -> None:
    """Installs Debian's openssh-server when sshd is missing; quick no-op when present."""
    if os.path.exists(SSHD) and shutil.which("ssh") and shutil.which("ssh-keygen"):
        return
    if shutil.which("apt-get") is None:
        raise HostsError(f"{SSHD} is missing and there is no apt-get to install it. "
                         "HINT: install OpenSSH's server and client (sshd, ssh, ssh-keygen).")
    with _global_lock():
        if os.path.exists(SSHD) and shutil.which("ssh"):
            return
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        _sh(["apt-get", "update", "-qq"], env=env, timeout=600)
        _sh(["apt-get", "install", "-y", "-qq", "--no-install-recommends",
             "openssh-server", "openssh-client"], env=env, timeout=600)


def _write(path: str, text: str, mode: int = 0o644) -> None:
    """Writes `text` to `path` through a temp file and a rename (never half-written)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _read_pid(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class HostRig:
    """A set of namespaced hosts h0..h{N-1} on one bridge; see `tfdist.hosts`.

    Args:
        name: Cluster name (a-z, 0-9, '-'; default "tfdist"). It prefixes the
            namespaces (`NAME-h0`) and names the state dir, so clusters with
            different names coexist, each in its own /24 of 198.18.0.0/15.
        state_root: Where state dirs live (default /run/tfdist-hosts).
    """

    def __init__(self, name: str = "tfdist", state_root: str = STATE_ROOT):
        self.name = planlib.check_name(name)
        self.state_dir = os.path.join(state_root, name)
        self._state_root = state_root

    # ---- paths -------------------------------------------------------------------------

    @property
    def ssh_config(self) -> str:
        """Path of the ssh_config to use from the root namespace: `ssh -F PATH h1 CMD`."""
        return os.path.join(self.state_dir, "ssh_config")

    @property
    def _state_file(self) -> str:
        return os.path.join(self.state_dir, "state.json")

    def _state(self) -> dict | None:
        try:
            with open(self._state_file) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def is_up(self) -> bool:
        """True when `up` has completed and `down` has not run since."""
        state = self._state()
        return bool(state and state.get("complete"))

    @property
    def plan(self) -> planlib.Plan:
        """The layout of the running cluster; HostsError when it is not up."""
        state = self._state()
        if not state:
            raise HostsError(f"cluster {self.name!r} is not up. HINT: python -m tfdist.hosts "
                             f"--cluster {self.name} up 2")
        return planlib.make_plan(self.name, state["subnet"], state["num_hosts"])

    @property
    def hosts(self) -> list[planlib.Host]:
        """The hosts, in order h0, h1, ..."""
        return list(self.plan.hosts)

    def address(self, host: str) -> str:
        """The address of `host` (e.g. 'h1' -> '198.18.0.2')."""
        return self.plan.host(host).address

    # ---- building ----------------------------------------------------------------------

    def up(self, num_hosts: int, rate: str | None = None) -> "HostRig":
        """Creates `num_hosts` hosts with sshd running on each; returns self.

        Args:
            num_hosts: How many hosts (h0..h{num_hosts-1}).
            rate: '1gbit', '10gbit', 'none' or None, or any '<n>mbit'/'<n>gbit':
                every host's link is shaped to that rate in both directions.

        Raises:
            HostsError: not root, no namespaces, the cluster is up already, or a
                system command failed (everything made so far is removed then).
        """
        bits = planlib.parse_rate(rate)
        reason = unavailable()
        if reason:
            raise HostsError(reason)
        ensure_sshd()
        with _global_lock():
            if os.path.exists(self._state_file):
                raise HostsError(f"cluster {self.name!r} exists already ({self.state_dir}). "
                                 f"HINT: python -m tfdist.hosts --cluster {self.name} down, or "
                                 "pick another --cluster name.")
            taken = self._taken_subnets()
            subnet = planlib.free_subnet(taken, preferred=self._preferred_subnet())
            plan = planlib.make_plan(self.name, subnet, num_hosts)
            os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
            _write(self._state_file, json.dumps({"subnet": subnet, "num_hosts": num_hosts,
                                                 "rate": rate, "complete": False}))
        try:
            self._build(plan, bits)
        except BaseException:
            self.down()
            raise
        _write(self._state_file, json.dumps({"subnet": subnet, "num_hosts": num_hosts,
                                             "rate": rate if bits else None, "complete": True}))
        return self

    def _preferred_subnet(self) -> int:
        # Stable per name, so a cluster usually gets the same addresses each time.
        return 0 if self.name == "tfdist" else sum(map(ord, self.name)) * 7 % planlib.SUBNETS

    def _taken_subnets(self) -> set[int]:
        taken = set()
        for entry in os.listdir(self._state_root):
            try:
                with open(os.path.join(self._state_root, entry, "state.json")) as f:
                    taken.add(json.load(f)["subnet"])
            except (OSError, ValueError, KeyError):
                continue
        links = _sh(["ip", "-o", "link", "show", "type", "bridge"], check=False).stdout
        for line in links.splitlines():
            name = line.split(":")[1].strip().split("@")[0]
            if name.startswith("tfd") and name.endswith("br") and name[3:-2].isdigit():
                taken.add(int(name[3:-2]))
        return taken

    def _build(self, plan: planlib.Plan, bits: int | None) -> None:
        d = self.state_dir
        key, host_key = os.path.join(d, "id_ed25519"), os.path.join(d, "host_ed25519_key")
        for path, comment in ((key, f"root@{self.name}"), (host_key, f"host@{self.name}")):
            _sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path])
        with open(key + ".pub") as f:
            _write(os.path.join(d, "authorized_keys"), f.read(), 0o600)
        with open(host_key + ".pub") as f:
            known = os.path.join(d, "known_hosts")
            _write(known, planlib.known_hosts(plan, f.read()))
        ssh_text = planlib.ssh_config(plan, key, known)
        _write(self.ssh_config, ssh_text)

        _sh(["ip", "link", "add", plan.bridge, "type", "bridge"])
        _sh(["ip", "addr", "add", f"{plan.root_address}/{plan.prefixlen}", "dev", plan.bridge])
        _sh(["ip", "link", "set", plan.bridge, "up"])
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
        for h in plan.hosts:
            ns = h.netns
            _sh(["ip", "netns", "add", ns])
            _sh(["ip", "link", "add", h.veth, "type", "veth", "peer", "name", h.peer])
            _sh(["ip", "link", "set", h.peer, "netns", ns])
            _sh(["ip", "link", "set", h.veth, "master", plan.bridge, "up"])
            _sh(["ip", "-n", ns, "link", "set", h.peer, "name", "eth0"])
            _sh(["ip", "-n", ns, "addr", "add", f"{h.address}/{plan.prefixlen}", "dev", "eth0"])
            _sh(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _sh(["ip", "-n", ns, "link", "set", "lo", "up"])
            if bits:
                # Both directions: the host's own egress, and the bridge's egress toward it.
                _sh(["tc", "-n", ns, "qdisc", "replace", "dev", "eth0", "root",
                     *planlib.tbf_args(bits)])
                _sh(["tc", "qdisc", "replace", "dev", h.veth, "root", *planlib.tbf_args(bits)])
            # `ip netns exec` bind-mounts these over /etc/hosts, /etc/hostname and
            # /etc/ssh, so inside a host plain `ssh h1` resolves and authenticates.
            etc = os.path.join(NETNS_ETC, ns)
            os.makedirs(os.path.join(etc, "ssh"), exist_ok=True)
            _write(os.path.join(etc, "hosts"), planlib.hosts_file(plan, own=h.name))
            _write(os.path.join(etc, "hostname"), h.name + "\n")
            _write(os.path.join(etc, "ssh", "ssh_config"), ssh_text)
            hd = os.path.join(d, h.name)
            os.makedirs(hd, exist_ok=True)
            cfg = os.path.join(hd, "sshd_config")
            _write(cfg, planlib.sshd_config(h, host_key, os.path.join(d, "authorized_keys"),
                                            os.path.join(hd, "sshd.pid")))
            # sshd forks into the background and writes its pid file when listening.
            _sh(self.command(h.name, [SSHD, "-f", cfg, "-E", os.path.join(hd, "sshd.log")]))
        for h in plan.hosts:
            self._wait_listening(h, os.path.join(d, h.name, "sshd.log"))

    def _wait_listening(self, h: planlib.Host, log: str, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with socket.create_connection((h.address, 22), timeout=1):
                    return
            except OSError as e:
                if time.monotonic() > deadline:
                    text = open(log).read()[-500:] if os.path.exists(log) else ""
                    raise HostsError(f"sshd on {h.name} ({h.address}:22) is not reachable after "
                                     f"{timeout_s:g}s: {e}. sshd log: {text!r}") from None
                time.sleep(0.1)

    # ---- using -------------------------------------------------------------------------

    def command(self, host: str, argv: list[str]) -> list[str]:
        """The argv that runs `argv` on `host`: in its namespace, with its hostname.

        Use it for your own Popen; `exec`/`popen` wrap it. The namespace's
        /etc/hosts and /etc/ssh are in effect (see `ip netns exec`).
        """
        h = self.plan.host(host)
        return ["ip", "netns", "exec", h.netns, "unshare", "--uts", "--",
                "sh", "-c", 'echo "$0" > /proc/sys/kernel/hostname && exec "$@"', h.name, *argv]

    def exec(self, host: str, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """Runs `argv` on `host` and waits (keyword arguments go to subprocess.run)."""
        return subprocess.run(self.command(host, argv), **kwargs)

    def popen(self, host: str, argv: list[str], **kwargs) -> subprocess.Popen:
        """Starts `argv` on `host` (keyword arguments go to subprocess.Popen)."""
        return subprocess.Popen(self.command(host, argv), **kwargs)

    def ssh_command(self, host: str, argv: list[str]) -> list[str]:
        """`ssh -F <ssh_config> HOST ARGV...` from the root namespace (a shell joins ARGV)."""
        self.plan.host(host)
        return ["ssh", "-F", self.ssh_config, host, *argv]

    def link(self, host: str, up: bool) -> None:
        """Plugs (`up=True`) or pulls (`up=False`) the cable of `host`.

        The root-namespace end goes down: the host keeps its address but no
        packet reaches it or leaves it, as when a switch port dies.
        """
        h = self.plan.host(host)
        _sh(["ip", "link", "set", h.veth, "up" if up else "down"])

    def pids(self, host: str) -> list[int]:
        """Every process running in `host`'s namespace (sshd included)."""
        h = self.plan.host(host)
        out = _sh(["ip", "netns", "pids", h.netns], check=False).stdout
        return sorted(int(p) for p in out.split())

    def processes(self, host: str) -> list[str]:
        """'PID COMMAND' lines for every process on `host` except its sshd."""
        sshd = _read_pid(os.path.join(self.state_dir, host, "sshd.pid"))
        lines = []
        for pid in self.pids(host):
            if pid == sshd:
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            lines.append(f"{pid} {cmd}")
        return lines

    def status(self) -> dict:
        """What exists: hosts, addresses, link state, sshd and process counts."""
        state = self._state()
        if not state:
            return {"cluster": self.name, "up": False}
        plan = self.plan
        hosts = []
        for h in plan.hosts:
            link = _sh(["ip", "-o", "link", "show", h.veth], check=False).stdout
            sshd = _read_pid(os.path.join(self.state_dir, h.name, "sshd.pid"))
            hosts.append({"name": h.name, "address": h.address, "netns": h.netns,
                          "link": "down" if not link else ("up" if ",UP" in link else "down"),
                          "sshd_pid": sshd if sshd and os.path.exists(f"/proc/{sshd}") else None,
                          "processes": len(self.processes(h.name))})
        return {"cluster": self.name, "up": bool(state.get("complete")),
                "subnet": f"{planlib.subnet_base(plan.subnet)}/{plan.prefixlen}",
                "root_address": plan.root_address, "bridge": plan.bridge,
                "rate": state.get("rate"), "ssh_config": self.ssh_config, "hosts": hosts}

    # ---- removing ----------------------------------------------------------------------

    def down(self) -> None:
        """Removes everything `up` made: processes, namespaces, links, files. Idempotent.

        Works from what is on the system (namespaces named `<cluster>-h*`), so
        it also cleans up after an `up` that was killed half-way.
        """
        state = self._state()
        plan = (planlib.make_plan(self.name, state["subnet"], state["num_hosts"])
                if state else None)
        prefix = f"{self.name}-h"
        listed = _sh(["ip", "netns", "list"], check=False).stdout.split("\n")
        namespaces = {line.split()[0] for line in listed
                      if line.startswith(prefix) and line.split()[0][len(prefix):].isdigit()}
        if plan:
            namespaces |= {h.netns for h in plan.hosts}
        for ns in sorted(namespaces):
            out = _sh(["ip", "netns", "pids", ns], check=False).stdout
            for pid in out.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
        for ns in sorted(namespaces):
            self._wait_empty(ns)
            _sh(["ip", "netns", "del", ns], check=False)
            shutil.rmtree(os.path.join(NETNS_ETC, ns), ignore_errors=True)
        if plan:
            for h in plan.hosts:
                _sh(["ip", "link", "del", h.veth], check=False)
            _sh(["ip", "link", "del", plan.bridge], check=False)
        shutil.rmtree(self.state_dir, ignore_errors=True)

    @staticmethod
    def _wait_empty(ns: str, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not _sh(["ip", "netns", "pids", ns], check=False).stdout.split():
                return
            time.sleep(0.05)
