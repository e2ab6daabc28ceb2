"""`python -m tfdist.hosts [--cluster NAME] up N | exec H -- CMD | link H down|up | status | down`.

See `tfdist.hosts` for what a host is. Exit status: 0 done, 2 bad input,
3 the cluster cannot be built or used here (not root, no namespaces, not up).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tfdist import exit_codes
from tfdist.hosts import plan as planlib
from tfdist.hosts.rig import HostRig, HostsError, ensure_sshd


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--cluster", default=argparse.SUPPRESS,
                        help="cluster name (default tfdist); prefixes its namespaces")
    p = argparse.ArgumentParser(prog="python -m tfdist.hosts", parents=[common],
                                description="Namespaced hosts h0..hN-1 on this machine (root).")
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", parents=[common], help="create N hosts with sshd")
    up.add_argument("num_hosts", type=int)
    up.add_argument("--rate", default="none",
                    help="shape every link: 1gbit, 10gbit, <n>mbit or none (default)")
    ex = sub.add_parser("exec", parents=[common], help="run a command on a host")
    ex.add_argument("host")
    ln = sub.add_parser("link", parents=[common], help="pull (down) or plug (up) a host's cable")
    ln.add_argument("host")
    ln.add_argument("state", choices=["down", "up"])
    st = sub.add_parser("status", parents=[common], help="hosts, addresses, links, sshd")
    st.add_argument("--json", action="store_true")
    sub.add_parser("down", parents=[common], help="remove everything (idempotent)")
    sub.add_parser("ssh-config", parents=[common], help="print the path for `ssh -F`")
    sub.add_parser("install", parents=[common], help="install openssh-server if missing")
    return p


def _print_status(s: dict) -> None:
    if not s["up"]:
        print(f"cluster {s['cluster']}: not up")
        return
    print(f"cluster {s['cluster']}: {len(s['hosts'])} host(s) on {s['subnet']} "
          f"(bridge {s['bridge']}, this namespace {s['root_address']}), "
          f"rate {s['rate'] or 'unshaped'}")
    print(f"  ssh -F {s['ssh_config']} HOST CMD")
    for h in s["hosts"]:
        sshd = f"sshd pid {h['sshd_pid']}" if h["sshd_pid"] else "sshd NOT running"
        print(f"  {h['name']:<4} {h['address']:<15} link {h['link']:<4} {sshd}, "
              f"{h['processes']} other process(es)")


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    argv = sys.argv[1:] if argv is None else argv
    command: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1:]
    args = _parser().parse_args(argv)
    name = getattr(args, "cluster", "tfdist")
    try:
        cluster = HostRig(name)
        if args.cmd == "exec":
            if not command:
                print("tfdist.hosts: no command after '--'. Example: python -m tfdist.hosts "
                      "exec h1 -- hostname", file=sys.stderr)
                return exit_codes.CONFIG
            argv = cluster.command(args.host, command)
            sys.stdout.flush()
            os.execvp(argv[0], argv)
        if command:
            print(f"tfdist.hosts: only `exec` takes a command after '--'. Received: "
                  f"{args.cmd} -- {' '.join(command)}", file=sys.stderr)
            return exit_codes.CONFIG
        if args.cmd == "up":
            planlib.parse_rate(args.rate)
            cluster.up(args.num_hosts, rate=args.rate)
            _print_status(cluster.status())
        elif args.cmd == "link":
            cluster.link(args.host, up=args.state == "up")
        elif args.cmd == "status":
            s = cluster.status()
            print(json.dumps(s, indent=1)) if args.json else _print_status(s)
        elif args.cmd == "down":
            cluster.down()
        elif args.cmd == "ssh-config":
            cluster.plan  # noqa: B018 - raises HostsError when the cluster is not up
            print(cluster.ssh_config)
        elif args.cmd == "install":
            ensure_sshd()
    except HostsError as e:
        print(f"tfdist.hosts: {e}", file=sys.stderr)
        return exit_codes.CLUSTER
    except ValueError as e:
        print(f"tfdist.hosts: {e}", file=sys.stderr)
        return exit_codes.CONFIG
    return 0


if __name__ == "__main__":
    sys.exit(main())
