"""`python -m tfdist.horovodrun [--grace-s S] HOROVODRUN-ARGS...`: horovodrun that lets ranks save.

The same command line as Horovod's `horovodrun` (run with the Python of the
venv that has Horovod), with one difference: after a SIGTERM or Ctrl-C it
gives the ranks `--grace-s` seconds (default 60) to reach their agreed step,
save a backup and exit before killing them, where horovodrun gives 5 s;
ranks on other hosts (Gloo, `-H`) get the signal through their ssh session,
which horovodrun would cut (`tfdist.compat.horovodrun_grace`). The batch script slurm/horovod.sbatch
uses it.

    $V/bin/python -m tfdist.horovodrun -np 2 -H localhost:2 --gloo \\
        $V/bin/python -m tfdist.train digits_mlp --strategy horovod
"""

from __future__ import annotations

import os
import sys

USAGE = ("usage: python -m tfdist.horovodrun [--grace-s SECONDS] HOROVODRUN-ARGS...\n"
         "  horovodrun's own command line (horovodrun --help lists it), giving the ranks\n"
         "  --grace-s seconds (default 60) after a SIGTERM or Ctrl-C to save before they\n"
         "  are killed (horovodrun itself gives 5); ranks on other hosts get the signal\n"
         "  through their ssh session instead of losing it.")


def parse(argv: list[str]) -> tuple[float, list[str]]:
    """Pure function: (grace seconds, horovodrun's arguments) from this command line.

    `--grace-s S` (or `--grace-s=S`) must come first; everything after it is
    horovodrun's.

    Raises:
        SystemExit: (2) with one line when `--grace-s` has no positive number.
    """
    from tfdist.compat.horovodrun_grace import DEFAULT_GRACE_S

    if not argv or argv[0] != "--grace-s" and not argv[0].startswith("--grace-s="):
        return DEFAULT_GRACE_S, list(argv)
    if "=" in argv[0]:
        value, rest = argv[0].split("=", 1)[1], argv[1:]
    else:
        value, rest = (argv[1] if len(argv) > 1 else ""), argv[2:]
    try:
        grace = float(value)
    except ValueError:
        grace = 0.0
    if not grace > 0:
        print(f"error: --grace-s needs a number of seconds > 0. Received: {value!r}.\n{USAGE}",
              file=sys.stderr)
        raise SystemExit(2)
    return grace, rest


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]) or not argv:
        print(USAGE)
        if not argv:
            return 2
        # horovodrun's own options follow.
    grace, rest = parse(argv)
    # horovodrun imports TensorFlow in this process before any rank starts, and the
    # venv's TensorFlow prints its C++ start-up lines unless told not to (as
    # tfdist.train and tfdist.launch tell theirs); the ranks inherit it.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tfdist.horovod import runtime

    if not runtime.is_available():  # checked without importing TensorFlow
        print(f"error: Horovod is not installed in this Python ({sys.executable}); run "
              f"`python -m tfdist.horovodrun` with the Horovod venv's python.\n"
              f"{runtime.INSTALL_HINT}", file=sys.stderr)
        return 2
    from tfdist.compat import horovodrun_grace

    return horovodrun_grace.run(rest, grace)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
