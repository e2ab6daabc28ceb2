"""tensorflow/tensorflow#58434: the coordination-service leader must exit last.

Upstream: under MultiWorkerMirroredStrategy every task's coordination-service
agent sends heartbeats to the service's leader (the chief, else worker 0).
When the leader's process exits while another task is still alive (its
Python teardown, or a longer final save, can take seconds), that task's next
heartbeat fails and TensorFlow aborts its collectives, logging at ERROR
level, which TF_CPP_MIN_LOG_LEVEL=2 does not hide:

    E0000 ... base_collective_executor.cc:252] BaseCollectiveExecutor::StartAbort
    UNAVAILABLE: Failed to send RPC to coordination service. Either the leader
    task was preempted/died/restarted unexpectedly ...

after a run that ended well or a Ctrl-C that saved (measured, TF 2.21, default
heartbeat: a task alive 12 s after the leader logged it 6 s after, one alive
3 s after did not; the CI saw it once after a Ctrl-C). TensorFlow offers no clean shutdown of the agent from Python, so
`leave` orders the exit instead: every task waits at one last barrier (the
leader reaches it after its final save), a task that is not the leader then
exits at once, and the leader exits when every other task's server port has
closed (its process is gone), or after `wait_s`.

Only for clusters where every task runs the same program (chief and worker
jobs): a parameter-server job's servers outlive their coordinator by design.
"""

from __future__ import annotations

import os
import sys
import time

from tfdist.ps.net import reachable

BARRIER = "tfdist_exit"
BARRIER_TIMEOUT_S = 300.0  # the chief reaches the barrier after writing its model
WAIT_S = 10.0  # the leader's wait for the other tasks' ports to close


def peers(cluster) -> tuple[bool, list[str]] | None:
    """Pure function: (this task is the leader, the other tasks' addresses).

    Args:
        cluster: This process's `ClusterInfo`; its `worker_addresses` are the
            chief's and the workers', in rank order, so rank 0 is the leader.

    Returns:
        None when the exit needs no order: one task, or tasks besides chief
        and worker (parameter servers).
    """
    addresses = cluster.worker_addresses
    if len(addresses) < 2 or cluster.num_tasks > len(addresses):
        return None
    return (cluster.worker_index == 0,
            [a for i, a in enumerate(addresses) if i != cluster.worker_index])


def leave(cluster, code: int, wait_s: float = WAIT_S, poll_s: float = 0.05) -> None:
    """Ends this process in the order the coordination service needs.

    Returns (and the caller exits as usual) when TensorFlow's coordination
    service is not in use. Otherwise a task that is not the leader exits here
    with `code`; the leader returns once the others are gone.

    Args:
        cluster: This process's `ClusterInfo`.
        code: The exit status.
        wait_s: The leader's longest wait for the others to exit.
        poll_s: How often the leader looks.
    """
    tf = sys.modules.get("tensorflow")
    if cluster is None or tf is None:
        return
    found = peers(cluster)
    from tensorflow.python.eager import context

    if found is None or context.context().coordination_service is None:
        return
    leader, others = found
    try:
        context.context().wait_at_barrier(BARRIER, int(BARRIER_TIMEOUT_S * 1000))
    except tf.errors.OpError:
        pass  # a task is gone already: nothing left to wait for
    if not leader:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # TensorFlow's teardown is what would keep this task alive
    deadline = time.monotonic() + wait_s
    while any(reachable(a, 0.5) for a in others) and time.monotonic() < deadline:
        time.sleep(poll_s)
