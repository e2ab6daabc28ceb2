"""Where the launcher's tasks run: ports on this host, or hosts with slots over ssh.

`_placed` gives each task its port (free on 127.0.0.1, or probed free on its
host) and its host; `_Remote` holds `--hosts` (slots, addresses, ssh config,
forwarded variables), fills the slots in order, drops unreachable hosts and
starts a task there. The ssh itself (watchdog, port probe, reachability,
`RemoteProcess`) is `tfdist.remote`'s. Imports no TensorFlow.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tfdist import remote
from tfdist.launch.plan import describe_exit, free_ports


class _Remote:
    """Where remote tasks go: hosts with slots, their addresses, how to ssh there."""

    def __init__(self, hosts: list[tuple[str, int]], ssh_config: str | None,
                 forward: tuple[str, ...] = (), addresses: dict | None = None):
        self.hosts, self.ssh_config, self.forward = hosts, ssh_config, forward
        self.addresses = addresses or {h: remote.resolve(h, ssh_config) for h, _ in hosts}

    def without(self, gone=frozenset(), one_slot_of: str | None = None) -> "_Remote":
        """These hosts less `gone` and less one slot of `one_slot_of` (see remote.without)."""
        return _Remote(remote.without(self.hosts, gone, one_slot_of), self.ssh_config,
                       self.forward, self.addresses)

    def spec(self) -> str:
        return ",".join(f"{h}:{n}" for h, n in self.hosts)

    def unreachable(self) -> dict[str, str]:
        """{host: why} for the hosts that do not answer over ssh now."""
        return remote.unreachable([h for h, _ in self.hosts], self.ssh_config)

    def placement(self, num_tasks: int) -> list[tuple[str, str, int]]:
        """(host, address, free port) for each task, slots filled in order."""
        on = remote.place(num_tasks, self.hosts)
        ports = {h: iter(remote.probe_ports(h, self.addresses[h], on.count(h), self.ssh_config,
                                            sys.executable))
                 for h, _ in self.hosts if h in on}
        return [(h, self.addresses[h], next(ports[h])) for h in on]

    def start(self, host: str, command: list[str], env: dict, **kwargs) -> subprocess.Popen:
        return remote.RemoteProcess(host, command, remote.forwarded_env(env, self.forward),
                                    os.getcwd(), self.ssh_config, **kwargs)


def _placed(num_tasks: int, where: "_Remote | None") -> tuple[list, list, list[str]]:
    """(ports, host per task, ' on HOST (ADDRESS)' per task) for local or remote tasks."""
    if where is None:
        return free_ports(num_tasks), [None] * num_tasks, [""] * num_tasks
    placed = where.placement(num_tasks)
    return ([(a, p) for _, a, p in placed], [h for h, _, _ in placed],
            [f" on {h} ({a})" for h, a, _ in placed])


def _describe(code: int, host: str | None) -> str:
    if host is not None and code == remote.SSH_FAILED:
        return f"ssh to {host} failed or lost its connection (ssh exit 255)"
    return describe_exit(code)


def _default_ssh_config() -> str | None:
    """The namespaced `tfdist` cluster's ssh config when it is up, else None (the user's)."""
    from tfdist.hosts import HostRig

    path = HostRig().ssh_config
    return path if os.path.exists(path) else None
