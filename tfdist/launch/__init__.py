"""`python -m tfdist.launch -n N [--timeout S] [--max-restarts R] -- COMMAND ...`.

`python -m tfdist.launch --ps N --workers M -- COMMAND ...` starts a
parameter-server cluster instead: a chief, M workers and N ps tasks, each
running COMMAND with its role in TF_CONFIG (see `run_ps`).

Like `torchrun --standalone`: picks N free ports on 127.0.0.1, gives each
worker a TF_CONFIG, prefixes every output line with the worker index, and
when any worker fails stops the others and exits non-zero naming which worker
failed and how. With `--max-restarts R` it then relaunches all workers (up to
R times), which resume from the chief's last backup. With `--min-workers M`
a worker that still fails after R restarts is left out and the survivors go
on (at least M of them), from the same backup at the same global batch: the
same math on fewer replicas. Imports no TensorFlow.

    python -m tfdist.launch -n 2 -- python -m tfdist.train digits_mlp --strategy multi_worker
    python -m tfdist.launch -n 2 -- python -m tfdist.train wide_mlp --strategy shm

With `--strategy shm` no TensorFlow server starts: worker 0's port is the
shared-memory engine's rendezvous.

`--hosts h0:2,h1:2` starts the workers on other hosts over ssh instead (as
horovodrun does; see `tfdist.remote`): the slots are filled in order (worker
0 and 1 on h0, 2 and 3 on h1), each worker's TF_CONFIG names its host's
address and a port found free there, the launcher's working directory and
environment (PATH, PYTHONPATH, TF_CPP_MIN_LOG_LEVEL, TFDIST_*, `-x NAME`) go
with it, and a worker dies with its ssh session, so none outlives the
launcher on any host. `--ps N --workers M --hosts ...` places the chief,
workers and ps the same way. ssh uses `--ssh-config FILE`; by default the
namespaced cluster's (`python -m tfdist.hosts up N`) when it is up, else the
user's own ssh configuration.

    python -m tfdist.hosts up 2
    python -m tfdist.launch --hosts h0:1,h1:1 -- python -m tfdist.train digits_mlp --strategy multi_worker

The gRPC ports TensorFlow opens are unauthenticated. Local workers are named
by 127.0.0.1 and remote ones by their host's address, but TensorFlow's server
listens on that port on every address of its host (it has no bind-address
option; measured: `*:PORT` in `ss -ltn`), so run it on a trusted network.

The package, one job a module: `plan` (pure functions: core shares, ports,
TF_CONFIGs, exit descriptions), `tasks` (starting, watching and stopping the
processes), `placement` (which host and port each task gets; `--hosts`),
`runner` (the run loops `run` and `run_ps`), `cli` (`main`, the command
line; `__main__` runs it).
"""

from tfdist.launch.cli import main
from tfdist.launch.plan import (HOST, OUTCOMES, core_sets, describe_exit, describe_outcome,
                                free_ports, log_file_name, ps_tf_configs, worker_tf_configs)
from tfdist.launch.runner import NO_RESTART, PS_GRACE_S, SIGNAL_GRACE_S, run, run_ps
from tfdist.launch.tasks import FAILED_GRACE_S, GRACE_S, PR_SET_PDEATHSIG

__all__ = ["FAILED_GRACE_S", "GRACE_S", "HOST", "NO_RESTART", "OUTCOMES", "PR_SET_PDEATHSIG",
           "PS_GRACE_S", "SIGNAL_GRACE_S", "core_sets", "describe_exit", "describe_outcome",
           "free_ports", "log_file_name", "main", "ps_tf_configs", "run", "run_ps",
           "worker_tf_configs"]
