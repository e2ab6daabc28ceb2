"""The launcher's command line: `python -m tfdist.launch` and `tfdist-launch`.

`main` parses the arguments (everything after `--` is COMMAND), refuses
combinations that do not go together, builds the `--hosts` placement and
hands the job to `runner.run` or `runner.run_ps`. Imports no TensorFlow.
"""

from __future__ import annotations

import argparse
import os
import sys

from tfdist import exit_codes, remote
from tfdist.errors import ClusterError, ConfigError
from tfdist.launch.placement import _default_ssh_config, _Remote
from tfdist.launch.runner import run, run_ps

def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    argv = sys.argv[1:] if argv is None else argv
    if "--" in argv:
        split = argv.index("--")
        own, command = argv[:split], argv[split + 1:]
    else:
        own, command = argv, []
    parser = argparse.ArgumentParser(
        prog="python -m tfdist.launch",
        description="Run N workers of COMMAND on 127.0.0.1, each with its own TF_CONFIG. "
                    "Everything after '--' is COMMAND, run as is by every worker; its output "
                    "is printed with a [worker I] prefix.",
        usage="python -m tfdist.launch (-n N | --hosts H:S,... | --ps N --workers M "
              "[--hosts H:S,...]) [--timeout S] [--max-restarts R [--min-workers M]] "
              "[--cpu-bind cores] [--log-dir DIR] -- COMMAND ...")
    parser.add_argument("-n", "--num-workers", type=int, default=None,
                        help="synchronous workers to start (MWMS, shm)")
    parser.add_argument("--hosts", default=None,
                        help="HOST:SLOTS,... (e.g. h0:2,h1:2): start the workers there over ssh")
    parser.add_argument("--ssh-config", default=None,
                        help="ssh config for --hosts (default: the namespaced cluster's from "
                             "`python -m tfdist.hosts up`, when it is up)")
    parser.add_argument("-x", dest="forward", action="append", default=[], metavar="NAME",
                        help="also pass environment variable NAME to remote workers")
    parser.add_argument("--ps", type=int, default=None,
                        help="parameter-server cluster: a chief, --workers M workers and N ps")
    parser.add_argument("--workers", type=int, default=None, help="workers, with --ps")
    parser.add_argument("--timeout", type=float, default=None,
                        help="stop all workers after S seconds (exit 124)")
    parser.add_argument("--max-restarts", type=int, default=0,
                        help="relaunch all workers up to R times after a failure")
    parser.add_argument("--min-workers", type=int, default=None,
                        help="when a worker still fails after R restarts, go on without it "
                             "while at least M workers remain (default: N, never shrink)")
    parser.add_argument("--cpu-bind", choices=("none", "cores"), default="none",
                        help="cores: each worker on this machine gets its own share of its "
                             "cores (sched_setaffinity); 2 MWMS workers on 2 cores trained "
                             "synthetic_cnn 6%% faster so (default: none)")
    parser.add_argument("--log-dir", default=None,
                        help="also write each task's output, unprefixed, to DIR/worker-I.log "
                             "(chief.log, ps-I.log with --ps)")
    args = parser.parse_args(own)
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    hosts = None
    if args.hosts is not None:
        if args.num_workers is not None:
            parser.error(f"--hosts {args.hosts} already says how many workers run where; -n N "
                         f"is for workers on this machine. Received: -n {args.num_workers} "
                         f"with --hosts {args.hosts}.")
        try:
            slots = remote.parse_hosts(args.hosts)
            if args.ps is not None and args.workers is not None:
                remote.place(1 + args.ps + args.workers, slots)
            hosts = _Remote(slots, args.ssh_config or _default_ssh_config(), tuple(args.forward))
        except ConfigError as e:
            parser.error(str(e))
        except ClusterError as e:
            print(f"tfdist.launch: {e}", file=sys.stderr)
            return exit_codes.CLUSTER
        if args.ps is None and args.workers is None:
            args.num_workers = sum(n for _, n in slots)
    elif args.ssh_config or args.forward:
        parser.error("--ssh-config and -x go with --hosts.")
    try:
        return _dispatch(parser, args, command, hosts)
    except ConfigError as e:
        parser.error(str(e))
    except ClusterError as e:
        print(f"tfdist.launch: {e}", file=sys.stderr)
        return exit_codes.CLUSTER


def _dispatch(parser, args, command, hosts) -> int:
    if args.ps is not None or args.workers is not None:
        if args.num_workers is not None:
            parser.error("use either -n N (synchronous workers) or --ps N --workers M "
                         f"(parameter server). Received: -n {args.num_workers} with "
                         f"--ps {args.ps} --workers {args.workers}.")
        if args.ps is None or args.workers is None or args.ps < 1 or args.workers < 1:
            parser.error("--ps and --workers go together, each >= 1. Received: "
                         f"--ps {args.ps} --workers {args.workers}.")
        if not command:
            parser.error("no COMMAND given after '--'. Example: python -m tfdist.launch --ps 1 "
                         "--workers 2 -- python -m tfdist.train digits_mlp "
                         "--strategy parameter_server")
        if args.cpu_bind != "none":
            parser.error(f"--cpu-bind applies to -n and --hosts workers, not to a "
                         f"parameter-server cluster. Received: --cpu-bind {args.cpu_bind} "
                         f"with --ps {args.ps}.")
        return run_ps(args.workers, args.ps, command, args.timeout, log_dir=args.log_dir,
                      hosts=hosts)
    if args.num_workers is None:
        parser.error("give -n N, --hosts H:S,..., or --ps N --workers M.")
    if args.num_workers < 1:
        parser.error(f"-n must be >= 1. Received: {args.num_workers}.")
    if not command:
        parser.error("no COMMAND given after '--'. Example: python -m tfdist.launch -n 2 -- "
                     "python -m tfdist.train digits_mlp --strategy multi_worker")
    if args.min_workers is not None:
        if not 1 <= args.min_workers <= args.num_workers:
            given = f"--hosts {args.hosts}" if hosts is not None else f"-n {args.num_workers}"
            parser.error(f"--min-workers must be in [1, the number of workers]. Received: "
                         f"--min-workers {args.min_workers} with {given}.")
    return run(args.num_workers, command, args.timeout, max_restarts=args.max_restarts,
               log_dir=args.log_dir, hosts=hosts, min_workers=args.min_workers,
               cpu_bind=args.cpu_bind)
