"""Which MultiWorkerMirrored peer was lost, from TensorFlow's error text.

Upstream: when a collective of MultiWorkerMirroredStrategy fails because a
peer task died or stopped answering, TensorFlow raises a `tf.errors.OpError`
(UnavailableError, InternalError, CancelledError, DeadlineExceededError)
whose only fields are `message`, `op` and `node_def`, and `op` is None when
the failing op ran inside a tf.function. The peer is named only in the text:
as a task's device name, `/job:worker/replica:0/task:1`, in gRPC's
"Additional GRPC error information from remote target ..." or the
coordination service's "unhealthy (stopped sending heartbeats)" list.
TensorFlow offers no structured way to ask which task failed (no upstream
issue tracks one), so this one function reads it, and nothing else in tfdist
parses an error message. tfdist's own engines (shm, Horovod) hand the lost
peer over as fields (`tfdist.errors.PeerLostError.rank`).
"""

from __future__ import annotations

import re

_TASK = re.compile(r"/job:(\w+)(?:/replica:\d+)?/task:(\d+)")


def lost_task(message: str, own: tuple[str, int]) -> tuple[str, int] | None:
    """Pure function: (job, task index) of the first task named in `message` other than `own`.

    Args:
        message: The text of TensorFlow's error.
        own: This process's (job, task index): its own devices appear in the
            text too, and are not the lost peer.

    Returns:
        The peer task, or None when the text names no other task (a timed-out
        collective names nobody).
    """
    for job, task in _TASK.findall(message):
        if (job, int(task)) != (own[0], int(own[1])):
            return job, int(task)
    return None
