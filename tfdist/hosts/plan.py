"""Pure functions: names, addresses and the text of every file a cluster writes.

Nothing here touches the system, so the whole layout of a cluster is tested
without root: which /24 of 198.18.0.0/15 it gets, what each interface and
namespace is called, and what goes into hosts files, ssh and sshd configs.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

# RFC 2544's benchmarking range: never routed, so nothing can leak out of it.
RANGE = ipaddress.ip_network("198.18.0.0/15")
SUBNETS = 512            # one /24 per cluster
MAX_HOSTS = 200          # hosts get .1 .. .200; the root namespace gets .254
ROOT_HOST = 254
NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,19}$")
RATES = {"none": None, "1gbit": 10**9, "10gbit": 10**10}


@dataclass(frozen=True)
class Host:
    """One namespaced host: its name, network namespace, address and veth names."""

    name: str        # h0, h1, ...: the hostname and what other hosts resolve
    netns: str       # ip netns name: "<cluster>-h0"
    address: str     # 198.18.x.(i+1)
    veth: str        # root-namespace end of its cable (link down/up pulls this one)
    peer: str        # namespace end before it is renamed eth0


@dataclass(frozen=True)
class Plan:
    """The layout of one cluster: where everything is, before anything exists."""

    cluster: str
    subnet: int              # index of its /24 within 198.18.0.0/15
    bridge: str
    root_address: str        # the root namespace's address on the bridge
    prefixlen: int
    hosts: tuple[Host, ...]

    def host(self, name: str) -> Host:
        """The host called `name` (h0, h1, ...), or ValueError listing the hosts."""
        for h in self.hosts:
            if h.name == name:
                return h
        raise ValueError(f"cluster {self.cluster!r} has no host {name!r}; its hosts are "
                         f"{[h.name for h in self.hosts]}.")


def check_name(cluster: str) -> str:
    """Returns `cluster` if usable as a prefix of namespace names, else ValueError."""
    if not NAME_RE.match(cluster or ""):
        raise ValueError("cluster name must be 1-20 characters of a-z, 0-9 and '-', starting "
                         f"with a letter. Received: {cluster!r}.")
    return cluster


def subnet_base(subnet: int) -> str:
    """'198.18.0.0' for subnet 0, '198.19.255.0' for subnet 511."""
    if not 0 <= subnet < SUBNETS:
        raise ValueError(f"subnet index must be in 0..{SUBNETS - 1}. Received: {subnet}.")
    return str(RANGE.network_address + 256 * subnet)


def make_plan(cluster: str, subnet: int, num_hosts: int) -> Plan:
    """The layout of `num_hosts` hosts of `cluster` in /24 number `subnet`.

    Interface names are built from the subnet index, not the cluster name,
    because Linux allows only 15 characters and the index is unique already.
    """
    check_name(cluster)
    if not 1 <= num_hosts <= MAX_HOSTS:
        raise ValueError(f"number of hosts must be in 1..{MAX_HOSTS}. Received: {num_hosts}.")
    base = ipaddress.ip_address(subnet_base(subnet))
    hosts = tuple(Host(name=f"h{i}", netns=f"{cluster}-h{i}", address=str(base + 1 + i),
                       veth=f"tfd{subnet}h{i}", peer=f"tfd{subnet}p{i}")
                  for i in range(num_hosts))
    return Plan(cluster=cluster, subnet=subnet, bridge=f"tfd{subnet}br",
                root_address=str(base + ROOT_HOST), prefixlen=24, hosts=hosts)


def free_subnet(taken: set[int], preferred: int = 0) -> int:
    """The first subnet index at or after `preferred` (wrapping) not in `taken`."""
    for k in range(SUBNETS):
        s = (preferred + k) % SUBNETS
        if s not in taken:
            return s
    raise ValueError(f"all {SUBNETS} subnets of {RANGE} are in use; run "
                     "`python -m tfdist.hosts --cluster NAME down` for clusters you no longer need.")


def parse_rate(rate: str | None) -> int | None:
    """Bits per second for '1gbit', '10gbit', '500mbit'...; None for 'none' or None."""
    if rate is None or rate == "none":
        return None
    m = re.fullmatch(r"(\d+)(k|m|g)bit", rate.strip().lower())
    if not m or int(m.group(1)) == 0:
        raise ValueError("rate must look like 1gbit, 10gbit, 500mbit or be 'none'. "
                         f"Received: {rate!r}.")
    return int(m.group(1)) * {"k": 10**3, "m": 10**6, "g": 10**9}[m.group(2)]


def tbf_args(bits_per_s: int) -> list[str]:
    """`tc qdisc ... tbf` arguments for a link of `bits_per_s`.

    The bucket holds 4 ms of traffic (at least 64 KiB) so that the 64 KiB
    segments veth passes with offloads on are never larger than the bucket,
    which would drop them; the queue holds 50 ms.
    """
    burst = max(64 * 1024, bits_per_s // 8 // 250)
    return ["tbf", "rate", f"{bits_per_s}bit", "burst", str(burst), "latency", "50ms"]


def hosts_file(plan: Plan, own: str | None = None) -> str:
    """/etc/hosts text resolving every host of `plan` (and `own` as itself)."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{h.address}\t{h.name}" for h in plan.hosts]
    if own is not None:
        lines.append(f"# this host: {own}")
    return "\n".join(lines) + "\n"


def ssh_config(plan: Plan, key: str, known_hosts: str) -> str:
    """ssh_config text: every host by name, as root, with the cluster's key.

    Host keys are pinned in `known_hosts` (written by `up`), so no prompt and
    no change to the user's ~/.ssh/known_hosts.
    """
    blocks = []
    for h in plan.hosts:
        blocks.append(f"Host {h.name} {h.address}\n    HostName {h.address}\n")
    common = ("Host *\n"
              "    User root\n"
              f"    IdentityFile {key}\n"
              "    IdentitiesOnly yes\n"
              f"    UserKnownHostsFile {known_hosts}\n"
              "    GlobalKnownHostsFile /dev/null\n"
              "    StrictHostKeyChecking yes\n"
              "    BatchMode yes\n"
              "    LogLevel ERROR\n"
              "    ConnectTimeout 10\n"
              "    ServerAliveInterval 5\n"
              "    ServerAliveCountMax 3\n")
    return "".join(blocks) + common


def known_hosts(plan: Plan, host_pubkey: str) -> str:
    """known_hosts text: every host's name and address with the shared host key."""
    key = " ".join(host_pubkey.split()[:2])
    return "".join(f"{h.name},{h.address} {key}\n" for h in plan.hosts)


def sshd_config(host: Host, host_key: str, authorized_keys: str, pid_file: str) -> str:
    """sshd_config text for one host: its own address only, root by key only."""
    return (f"ListenAddress {host.address}:22\n"
            f"HostKey {host_key}\n"
            f"PidFile {pid_file}\n"
            f"AuthorizedKeysFile {authorized_keys}\n"
            "PermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
            # The state dir is root's but lives under /run, not ~/.ssh.
            "StrictModes no\n"
            # Workers inherit TF_CPP_MIN_LOG_LEVEL etc. through `env` in the command,
            # not through AcceptEnv, so no client-side SendEnv is needed.
            "PrintMotd no\n"
            "PrintLastLog no\n"
            "UseDNS no\n"
            "MaxStartups 100:30:200\n"
            "MaxSessions 100\n"
            "ClientAliveInterval 5\n"
            "ClientAliveCountMax 3\n"
            "LogLevel ERROR\n")
