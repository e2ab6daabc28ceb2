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

Ranks on other hosts (Gloo, `-H h0:1,h1:1`) had no grace at all: horovodrun
runs them as `ssh HOST CMD` and terminates the ssh client, so the remote rank
lost its session (measured: its peer saw "Connection reset by peer" 0.5 s
after the SIGTERM, and the chief exited "lost contact" without its backup).
`apply` therefore also wraps each remote rank's command: the remote side
runs under `tfdist.remote.WATCHDOG` (as `tfdist.launch --hosts` workers do),
and the local side under `relay`, which, on the SIGTERM or SIGINT horovodrun
sends it, forwards the signal through the session's stdin and keeps the
session (and its output) open until the rank exits; if the relay is killed,
the session closes and the watchdog stops the rank. With `--mpi`, mpirun
starts and signals the remote ranks itself; that path is unchanged.

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
import shlex
import signal
import subprocess
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
    from horovod.runner import gloo_run

    if not hasattr(gloo_run, "_tfdist_original_remote_command"):
        gloo_run._tfdist_original_remote_command = gloo_run.get_remote_command
    # gloo_run imported the function by name; its per-rank threads look it up there.
    gloo_run.get_remote_command = functools.partial(
        remote_command, gloo_run._tfdist_original_remote_command, sys.executable)


def remote_command(ssh_command, python: str, local_command: str, host: str, port=None,
                   identity_file=None, timeout_s=None) -> str:
    """The shell line that runs one remote Gloo rank: `relay` around ssh, WATCHDOG around it.

    Args:
        ssh_command: Horovod's own `get_remote_command` (builds `ssh ... HOST LINE`).
        python: The interpreter for the relay here and the watchdog there (the
            venv's: horovodrun assumes the same paths on every host).
        local_command: What Horovod runs on the host, shell-quoted as one word.
        host, port, identity_file, timeout_s: As Horovod passes them.
    """
    from horovod.runner.common.util import env as env_util

    if env_util.is_kubeflow_mpi():  # kubectl exec, not ssh: left as Horovod has it
        return ssh_command(local_command, host, port, identity_file, timeout_s)
    from tfdist.remote import WATCHDOG

    # The watchdog signals its child's process group and stops when that child ends; the
    # child is a shell (Horovod's line is `cd DIR; VARS... CMD`), which must outlive a
    # SIGTERM to wait for the rank, so it traps (not ignores: the rank would inherit that).
    keep = shlex.quote('trap : TERM INT HUP; eval "$1"')
    there = (f"exec {shlex.quote(python)} -c {shlex.quote(WATCHDOG)} sh -c {keep} sh "
             f"{local_command}")
    ssh = ssh_command(shlex.quote(there), host, port, identity_file, timeout_s)
    # Not `exec`: Horovod signals the *children* of the shell it starts, which must be the
    # relay, not the ssh client (a shell runs its last command in place; `; exit` prevents it).
    return f"{shlex.quote(python)} -m tfdist.compat.horovodrun_grace --relay -- {ssh}; exit $?"


def relay(argv: list[str]) -> int:
    """Runs `argv` (an ssh to a WATCHDOG) and forwards SIGTERM/SIGINT through its stdin.

    Returns:
        The session's status (a signal N as 128+N, as a shell reports it).
    """
    from tfdist.remote import forward_signal, shell_status

    proc = subprocess.Popen(argv, stdin=subprocess.PIPE)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: forward_signal(proc.stdin, signum))
    return shell_status(proc.wait())


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


if __name__ == "__main__":
    # Only as horovodrun's per-rank command: `python -m tfdist.compat.horovodrun_grace --relay -- ssh ...`.
    if sys.argv[1:3] != ["--relay", "--"] or len(sys.argv) < 4:
        sys.exit("usage: python -m tfdist.compat.horovodrun_grace --relay -- SSH-COMMAND ... "
                 "(started by tfdist.horovodrun for ranks on other hosts)")
    sys.exit(relay(sys.argv[3:]))
