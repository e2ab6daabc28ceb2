"""horovodrun SIGKILLs its ranks 5 s after passing on a SIGTERM: too soon for a save.

Upstream: horovod 0.28.1, horovod/runner/common/util/safe_shell_exec.py,
`GRACEFUL_TERMINATION_TIME_S = 5`, a module constant with no flag or
environment variable (no upstream issue found). On SIGTERM or SIGINT
(Slurm's `--signal`, `scancel`, Ctrl-C) horovodrun terminates every rank and
kills those still running 5 s later; it does the same to the other ranks when
one fails. tfdist's ranks save at the next step they all agree on
(`--preempt-check-steps`, every 20 steps with several processes), so a model
whose 20 steps take more than ~5 s is killed before its backup is written and
the preempted job loses everything since its last periodic backup
(tests/compat/test_horovodrun_grace.py shows it with a plain horovodrun).

The constant is read by horovodrun's "middleman" processes, one per rank,
which multiprocessing *spawns* (fresh interpreters that import the module
again), so setting it in horovodrun's own process changes nothing (measured).
`apply` therefore swaps in a middleman that sets it first, then runs
Horovod's own; `run` starts horovodrun's command line with it applied, so the
ranks have time to reach the agreed step, save and exit. A rank that hangs is
still killed, `grace_s` later.
"""

from __future__ import annotations

import functools
import sys

# What tfdist.launch gives its workers after forwarding a signal (SIGNAL_GRACE_S),
# and the bound on a lost peer (--collective-timeout-s): a rank that cannot save
# in that time is not going to.
DEFAULT_GRACE_S = 60.0


def apply(grace_s: float = DEFAULT_GRACE_S) -> None:
    """Raises horovodrun's SIGTERM-to-SIGKILL grace to `grace_s` in this process.

    Raises:
        ValueError: when `grace_s` is not positive.
    """
    if not grace_s > 0:
        raise ValueError(f"grace_s must be > 0. Received: {grace_s!r}.")
    from horovod.runner.common.util import safe_shell_exec

    safe_shell_exec.GRACEFUL_TERMINATION_TIME_S = grace_s
    if not hasattr(safe_shell_exec, "_tfdist_original_middleman"):  # apply twice: wrap once
        safe_shell_exec._tfdist_original_middleman = safe_shell_exec._exec_middleman
    # `execute` looks the target up at each call; a partial of a module-level
    # function pickles by name, as the spawn start method needs.
    safe_shell_exec._exec_middleman = functools.partial(_middleman, grace_s)


def _middleman(grace_s: float, *args, **kwargs):
    """Runs in each spawned middleman: the grace first, then Horovod's own middleman."""
    from horovod.runner.common.util import safe_shell_exec

    safe_shell_exec.GRACEFUL_TERMINATION_TIME_S = grace_s
    # Spawned: a fresh import, Horovod's own is still in place. (Forked, it would be the wrapper.)
    original = getattr(safe_shell_exec, "_tfdist_original_middleman",
                       safe_shell_exec._exec_middleman)
    return original(*args, **kwargs)


def run(argv: list[str], grace_s: float = DEFAULT_GRACE_S) -> int:
    """Runs `horovodrun ARGV` in this process with the raised grace; returns its status.

    horovodrun reports a failed rank as a RuntimeError traceback; it is shown
    as one line here (the ranks' own output says why they failed).
    """
    apply(grace_s)
    from horovod.runner import launch

    sys.argv = ["horovodrun", *argv]
    try:
        launch.run_commandline()
    except RuntimeError as e:
        print(f"horovodrun: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    return 0
