"""`python -m tfdist.bench.bind [--share I/N] -- COMMAND ...`: COMMAND on one share of the cores.

`tfdist.launch --cpu-bind cores` binds the workers it starts; horovodrun has
no such option with Gloo (its `--binding-args` go to mpirun only), and it
starts the same command for every rank. The benchmarks therefore put this
wrapper in front of each Horovod rank: it binds itself to share
`HOROVOD_LOCAL_RANK` of `HOROVOD_SIZE` (as `tfdist.launch.core_sets` cuts
this process's cores, so both engines get the same shares) and execs the
command, which inherits the binding. `--share I/N` names the share instead,
e.g. `--share 0/2` for a 1-worker baseline on the core one of two workers
would get. The benchmarks run every rank on one host, so a rank's local
share is of the whole job's size. Imports no TensorFlow.
"""

from __future__ import annotations

import argparse
import os
import sys

from tfdist.launch import core_sets


def parse_share(text: str) -> tuple[int, int]:
    """Pure function: "I/N" -> (I, N), checked.

    Raises:
        ValueError: naming what was received.
    """
    i, sep, n = text.partition("/")
    if not (sep and i.isdigit() and n.isdigit() and 0 <= int(i) < int(n)):
        raise ValueError(f"--share takes I/N with 0 <= I < N, e.g. 0/2. Received: {text!r}.")
    return int(i), int(n)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfdist.bench.bind", description=__doc__)
    parser.add_argument("--share", default=None,
                        help="I/N: share I of N (default: this Horovod rank's)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no COMMAND given after --")
    if args.share is not None:
        try:
            index, n = parse_share(args.share)
        except ValueError as e:
            parser.error(str(e))
    else:
        from tfdist.cluster.horovod import HorovodEnvironment
        from tfdist.errors import ClusterError

        try:
            info = HorovodEnvironment.resolve(os.environ)
        except ClusterError as e:
            parser.error(f"{e} (or pass --share I/N)")
        index, n = info.local_rank, info.num_workers
    os.sched_setaffinity(0, core_sets(sorted(os.sched_getaffinity(0)), n)[index])
    os.execvp(command[0], command)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
