"""TensorFlow names a lost MultiWorkerMirrored peer only in its error text.

The messages below are real: `str(e)` of the `tf.errors.UnavailableError`
that TensorFlow 2.21 raised in a `tf.function` all-reduce of
MultiWorkerMirroredStrategy on 127.0.0.1 when a peer task was SIGKILLed
(2 and 3 workers, CommunicationOptions(timeout_seconds=20)). The error has
no field naming the task (`e.op` is None in a tf.function): only the text
does, which is what `lost_task` reads.
"""

import pytest

from tfdist.compat.tf_peer_errors import lost_task
from tfdist.errors import PeerLostError

PREFIX = ('Graph execution error:\n\nDetected at node CollectiveReduceV2 defined at (most recent '
          'call last):\n  File "w.py", line 15, in <module>\n\n  File "w.py", line 10, in f\n\n')
SUFFIX = ("The error could be from a previous operation. Restart your program to reset.\n\t "
          "[[{{node CollectiveReduceV2}}]] [Op:__inference_f_29]")
# Worker 0 of 2, after worker 1 died: the coordination service's heartbeat check.
HEARTBEATS = (PREFIX + "Collective ops is aborted by: Error reported from /job:worker/task:1: "
              "The following tasks are unhealthy (stopped sending heartbeats):\n"
              "/job:worker/replica:0/task:1\nThe tasks have crashed. Check the task logs for an "
              "earlier error, or scheduler events (e.g. preemption, eviction) to debug "
              "further.\n" + SUFFIX)
# Worker 0 of 3, after worker 2 died: gRPC names the remote target.
GRPC_RESET = (PREFIX + "Collective ops is aborted by: recvmsg:Connection reset by peer\n"
              "Additional GRPC error information from remote target /job:worker/replica:0/task:2 "
              "while calling /tensorflow.WorkerService/RecvBuf:\n:UNKNOWN:Error received from "
              'peer  {grpc_message:"recvmsg:Connection reset by peer", grpc_status:14}\n' + SUFFIX)
# Worker 1 of 3, after worker 0 (the coordination leader) ended.
LEADER_GONE = (PREFIX + "Collective ops is aborted by: Failed to send RPC to coordination "
               "service. Either the leader task was preempted/died/restarted unexpectedly or "
               "this task is experiencing network issues.\nAdditional GRPC error information "
               "from remote target /job:worker/replica:0/task:0 while calling "
               "/tensorflow.CoordinationService/Heartbeat:\n:UNKNOWN:Error received from peer  "
               '{grpc_status:14, grpc_message:"failed to connect to all addresses; last error: '
               'UNKNOWN: ipv4:127.0.0.1:33075: Failed to connect to remote host: Connection '
               'refused"}\n' + SUFFIX)
TIMED_OUT = "Collective ops is aborted by: Collective has timed out during execution."


@pytest.mark.parametrize("message,own,peer", [
    (HEARTBEATS, ("worker", 0), ("worker", 1)),
    (GRPC_RESET, ("worker", 0), ("worker", 2)),   # 3 workers: only the text can tell
    (LEADER_GONE, ("worker", 1), ("worker", 0)),
    ("/job:worker/replica:0/task:0/device:CPU:0 and /job:chief/replica:0/task:0",
     ("worker", 0), ("chief", 0)),                # our own device is not the peer
    (TIMED_OUT, ("worker", 0), None),             # a timeout names nobody
])
def test_lost_task_reads_the_peer_from_real_tensorflow_errors(message, own, peer):
    assert lost_task(message, own) == peer


def test_mwms_collectives_hand_the_peer_over_as_fields():
    from tfdist.collectives.mwms import MWMSCollectives

    engine = MWMSCollectives.__new__(MWMSCollectives)  # no strategy needed to read an error
    engine.task = ("worker", 0)
    lost = engine.lost_peer(RuntimeError(GRPC_RESET))
    assert isinstance(lost, PeerLostError) and (lost.job, lost.rank) == ("worker", 2)
    assert engine.lost_peer(RuntimeError(TIMED_OUT)) is None
    # A PeerLostError raised as such is taken as it is.
    direct = PeerLostError("gone", rank=1, address="10.0.0.2:5001")
    assert engine.lost_peer(direct) is direct
