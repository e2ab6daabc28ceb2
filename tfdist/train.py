"""`python -m tfdist.train [RECIPE] [--key value ...]`: train a recipe.

Launch modes:
    python -m tfdist.train                          # digits_mlp, this machine, no cluster
    python -m tfdist.train digits_mlp --strategy mirrored --devices 2
    python -m tfdist.launch -n 2 -- python -m tfdist.train digits_mlp --strategy multi_worker
    python -m tfdist.launch -n 2 -- python -m tfdist.train digits_mlp --strategy shm   # one host
    TF_CONFIG='{"cluster": ..., "task": ...}' python -m tfdist.train digits_mlp   # each host
    python -m tfdist.launch --hosts h0:2,h1:2 -- python -m tfdist.train digits_mlp   # over ssh
    srun python -m tfdist.train digits_mlp          # each task of a Slurm step
    V=~/.cache/tfdist/horovod-venv   # the Horovod venv (holds no tfdist); from the checkout:
    PYTHONPATH=$PWD $V/bin/horovodrun -np 4 -H localhost:4 --gloo $V/bin/python -m tfdist.train digits_mlp --strategy horovod
    python -m tfdist.launch --ps 1 --workers 2 -- python -m tfdist.train digits_mlp --strategy parameter_server
    TFDIST_NUM_PS=1 srun -n 3 --overcommit python -m tfdist.train digits_mlp --strategy parameter_server

RECIPE is a path to a recipe file, or a name: ./RECIPE.py in the working
directory, else a recipe shipped with tfdist (recipes/); `--help` lists its
options. Every bad option fails here, before TensorFlow starts.
"""

from __future__ import annotations

import os
import signal
import sys

from tfdist import config, exit_codes, recipe as recipe_lib
# Registers the benchmarks' --straggler-* options (tfdist.instruments).
from tfdist import straggler  # noqa: F401
from tfdist.errors import ClusterError, ConfigError, PeerLostError
from tfdist.run.types import Preempted
from tfdist.settings import Settings

DEFAULT_RECIPE = "digits_mlp"


def parse(argv: list[str]):
    """Returns (recipe module, merged config) for the command line.

    Raises:
        ConfigError: for a missing recipe or a bad option.
    """
    name = DEFAULT_RECIPE
    if argv and not argv[0].startswith("-"):
        name, argv = argv[0], argv[1:]
    recipe = recipe_lib.load(name)
    cfg = config.merge(recipe.DECLARED, argv, f"recipe {recipe.RECIPE_NAME}")
    if hasattr(recipe, "distribution"):  # a keras.distribution in place of --strategy
        from tfdist import cluster
        from tfdist.keras_distribution import recipes

        cfg = recipes.apply(recipe, cfg, cluster.detect())
    return recipe, cfg


def main(argv: list[str] | None = None) -> int:
    """Trains as the command line says; returns the exit status.

    The signals are this process's own again afterwards (`cli` keeps catching
    them until it exits, so that one during its last steps is still recorded).
    """
    try:
        return _main(argv)[0]
    finally:
        from tfdist import preemption

        caught = preemption.current()
        if caught is not None:
            caught.uninstall()


def cli() -> None:
    """The `python -m tfdist.train` and `tfdist-train` entry point: trains, then exits.

    A worker of a MultiWorkerMirrored job exits in the order TensorFlow's
    coordination service needs (`tfdist.compat.tf_coordination_exit`).
    """
    try:
        code, info = _main(sys.argv[1:])
    except BrokenPipeError:
        # The reader of a pipe left (`--help | head`): stop quietly, as a C tool killed
        # by SIGPIPE would, and keep Python's own flush at exit from raising again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(128 + signal.SIGPIPE)
    if code in (exit_codes.OK, exit_codes.INTERRUPTED, exit_codes.PREEMPTED):
        from tfdist.compat import tf_coordination_exit

        tf_coordination_exit.leave(info, code)
    sys.exit(code)


def _main(argv: list[str] | None) -> tuple[int, object]:
    """(exit status, this process's ClusterInfo or None) for the command line."""
    argv = sys.argv[1:] if argv is None else argv
    info = None
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if argv and argv[0] in ("-h", "--help") or "--help" in argv:
        name = argv[0] if argv and not argv[0].startswith("-") else DEFAULT_RECIPE
        try:
            recipe = recipe_lib.load(name)
            options = config.declarations(recipe.DECLARED, f"recipe {recipe.RECIPE_NAME}")
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2, None
        import textwrap

        print(__doc__)
        print(textwrap.fill("Reruns: " + config.RERUN_RULE, 88, break_on_hyphens=False)
              + " (docs/options.md)\n")
        print(f"recipes: {recipe_lib.available()}\n")
        print(config.usage(options, recipe.RECIPE_NAME))
        return 0, None
    status_file = ""
    # First, before any thread starts (the lifeline's, TensorFlow's): from here on
    # SIGTERM and SIGINT are recorded whenever they come (tfdist.preemption), so
    # every one ends in the documented status, with a backup once a step is trained.
    from tfdist import preemption

    watcher = preemption.catch_signals()
    from tfdist import lifeline

    lifeline.watch_output_pipes()  # the launcher's pipes closing ends this worker
    try:
        recipe, cfg = parse(argv)
        from tfdist import cluster
        from tfdist.run import trainer

        info = cluster.detect()
        status_file = Settings.of(cfg).backup.status_file if info.is_chief else ""
        trainer.train(recipe, cfg, info)
        code = exit_codes.OK
        if watcher.requested:
            # The signal came after the last step the workers agreed on (the last
            # --preempt-check-steps steps, the evaluation, the final save): the run
            # finished meanwhile, and its final epoch's backup is there. The status
            # still says the signal was acted on; a rerun finds the run finished.
            code = exit_codes.INTERRUPTED if watcher.interrupted else exit_codes.PREEMPTED
            print(f"tfdist: {watcher.cause} after the last step: the run finished (model and "
                  "final backup written); a rerun has nothing left to do", file=sys.stderr,
                  flush=True)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        code = exit_codes.CONFIG
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        code = exit_codes.CLUSTER
    except PeerLostError as e:
        print(f"error: {e}", file=sys.stderr)
        code = exit_codes.PEER_LOST
    except KeyboardInterrupt:  # Ctrl-C outside training (start-up, evaluation): no step to save
        print("tfdist: interrupted outside training; nothing new saved; rerun to continue",
              file=sys.stderr, flush=True)
        code = exit_codes.INTERRUPTED
    except Preempted as e:
        print(f"tfdist: {e}", file=sys.stderr, flush=True)
        code = exit_codes.INTERRUPTED if e.interrupted else exit_codes.PREEMPTED
    if status_file:
        write_status(status_file, code)
    if code == exit_codes.PEER_LOST:
        exit_now(code)
    return code, info


def exit_now(code: int) -> None:
    """Exits at once, skipping TensorFlow's teardown, after a peer was lost.

    The teardown waits on RPCs to the lost peer: measured 14 s after the
    message when the peer was SIGSTOPped (its kernel still acknowledges, so
    nothing fails fast), 30 s and more on a loaded machine. The backup and
    the status file are already written, so there is nothing left to do.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def write_status(path: str, code: int) -> None:
    """Writes `code` and a newline to `path` atomically (temp file, then rename)."""
    from tfdist.writer import atomic_write_text

    atomic_write_text(path, f"{code}\n")


if __name__ == "__main__":
    cli()
