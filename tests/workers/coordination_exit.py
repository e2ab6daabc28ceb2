"""Test worker: one MultiWorkerMirrored all-reduce, then an exit in one of two orders.

    TF_CONFIG=... python tests/workers/coordination_exit.py upstream|ordered LINGER_S

Worker 1 lingers LINGER_S seconds after the all-reduce (a slow teardown or
save); worker 0, the coordination-service leader, is done at once.
upstream: each exits when it is done (tensorflow/tensorflow#58434: worker 1's
next heartbeat fails and it logs "StartAbort"); ordered: each then calls
`tfdist.compat.tf_coordination_exit.leave`, and worker 0 prints how long it waited.
"""

import sys
import time

import tensorflow as tf
from tensorflow.python.distribute.collective_all_reduce_strategy import coordination_config_pb2
from tensorflow.python.eager import context

from tfdist.cluster import detect
from tfdist.compat import tf_coordination_exit


def main():
    mode, linger_s = sys.argv[1], float(sys.argv[2])
    info = detect()
    # A 2 s heartbeat timeout (a heartbeat each second) so that the test needs
    # a short linger; MultiWorkerMirroredStrategy keeps a service configured before it.
    context.context().configure_coordination_service(
        service_type="standalone", service_leader="/job:worker/replica:0/task:0",
        heartbeat_timeout_in_ms=2000,
        coordinated_jobs=[coordination_config_pb2.CoordinatedJob(name="worker", num_tasks=2)])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
    print(f"SUM {float(total)}", flush=True)
    if info.task_index == 1:
        time.sleep(linger_s)
    if mode == "ordered":
        start = time.monotonic()
        tf_coordination_exit.leave(info, 0)
        print(f"LEFT_AFTER {time.monotonic() - start:.2f}", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
