"""Several hosts on one machine: a namespaced test cluster (needs root). Imports no TensorFlow.

Each host `h0..h{N-1}` is a Linux network namespace with its own address in
198.18.0.0/15 (the benchmarking range, never routed), a veth "cable" to one
bridge, loopback up, its own hostname, an /etc/hosts naming every host, and
an sshd on its own address that lets root in with a key `up` generated. The
root namespace has an address on the bridge too, so it reaches every host.
Traffic never leaves the namespaces and the bridge.

Command line::

    python -m tfdist.hosts up 2 [--rate 1gbit|10gbit|none]   # h0, h1
    python -m tfdist.hosts exec h1 -- hostname               # prints h1
    python -m tfdist.hosts link h1 down                      # pull h1's cable (and `up`)
    python -m tfdist.hosts status [--json]
    python -m tfdist.hosts ssh-config                        # path for `ssh -F`
    python -m tfdist.hosts down                              # idempotent; removes everything
    python -m tfdist.hosts install                           # openssh-server, if missing

Every command takes `--cluster NAME` (default `tfdist`): namespaces are
`NAME-h0`, `NAME-h1`..., the state (keys, ssh_config, known_hosts, sshd
configs and logs) is in /run/tfdist-hosts/NAME/, and each cluster gets its own
/24, so clusters with different names coexist. Host names (h0, h1...) are the
same in every cluster: they are resolved per cluster, never in the root
namespace's /etc/hosts.

ssh:
    - From the root namespace: `ssh -F /run/tfdist-hosts/NAME/ssh_config h1 hostname`
      (the path is `HostRig(NAME).ssh_config` or `python -m tfdist.hosts ssh-config`).
      It pins the hosts' key in its own known_hosts; ~/.ssh is never touched.
    - On any host (`exec`, or inside an ssh session): plain `ssh h1 hostname`
      works, because `ip netns exec` mounts the cluster's ssh_config over
      /etc/ssh/ssh_config and its hosts file over /etc/hosts. So `horovodrun
      -H h0:1,h1:1` run on h0 (`python -m tfdist.hosts exec h0 -- horovodrun ...`)
      reaches h1 with no flags.
    - `python -m tfdist.launch --hosts h0:1,h1:1` uses `ssh -F` with the
      `tfdist` cluster's ssh_config, or `--ssh-config PATH` (see tfdist.launch).

Python API (for tests and benches)::

    from tfdist.hosts import HostRig, unavailable

    reason = unavailable()          # None, or why namespaces cannot be made here
    c = HostRig("t-mine").up(2, rate="1gbit")   # HostsError on failure (cleaned up)
    try:
        c.hosts                     # [Host(name='h0', netns='t-mine-h0', address='198.18.x.1', ...), ...]
        c.address("h1")             # '198.18.x.2'
        c.exec("h1", ["hostname"], capture_output=True, text=True)   # CompletedProcess
        p = c.popen("h0", ["python", "-m", "tfdist.train", ...], env=...)  # Popen
        c.command("h0", argv)       # the argv that runs argv on h0 (for your own Popen)
        c.ssh_command("h1", ["hostname"])  # ['ssh', '-F', c.ssh_config, 'h1', 'hostname']
        c.link("h1", up=False)      # pull the cable; c.link("h1", up=True) plugs it back
        c.processes("h1")           # 'PID CMD' of every process on h1 except its sshd
        c.status()                  # dict: subnet, root_address, rate, per-host link/sshd
    finally:
        c.down()                    # idempotent; also cleans up a half-made cluster

`HostRig(name)` itself changes nothing; `HostRig(name).down()` removes a
cluster made by another process (e.g. by the command line).
"""

from tfdist.hosts.rig import HostRig, HostsError, ensure_sshd, unavailable
from tfdist.hosts.plan import Host, Plan

__all__ = ["HostRig", "Host", "HostsError", "Plan", "ensure_sshd", "unavailable"]
