"""Workers and parameter servers: a `tf.distribute.Server` that waits for work.

A server has no training loop of its own: the coordinator sends it functions
(workers) or keeps variables on it (ps). TensorFlow's `Server.join()` never
returns, so a server whose coordinator died would wait forever; a watchdog
thread ends it once the chief, seen up before, stops answering.
"""

from __future__ import annotations

import os
import sys
import threading
import time

CHIEF_POLL_S = 2.0
CHIEF_MISSES = 3  # consecutive refused connections before the chief counts as gone


def _watch_chief(address: str, label: str) -> None:
    from tfdist.ps import EXIT_LOST_CHIEF, reachable

    seen, misses = False, 0
    while True:
        time.sleep(CHIEF_POLL_S)
        if reachable(address):
            seen, misses = True, 0
            continue
        misses += 1
        if seen and misses >= CHIEF_MISSES:
            print(f"tfdist: {label}: the chief at {address} has gone (finished or failed); "
                  "this task has nothing left to serve and exits.", flush=True)
            sys.stdout.flush()
            os._exit(EXIT_LOST_CHIEF)  # join() cannot be interrupted otherwise


def serve(cluster, cfg: dict):
    """Starts this task's server and blocks until the chief has gone.

    Args:
        cluster: ClusterInfo of a worker or ps task.
        cfg: The run configuration (`threads` sets intra-op threads).
    """
    import tensorflow as tf

    spec = {k: v for k, v in cluster.tf_config["cluster"].items()
            if k in ("chief", "worker", "ps")}
    config = tf.compat.v1.ConfigProto()
    if cfg.get("threads"):
        # Intra-op only: a remote step blocks an inter-op thread while it waits
        # for its input, so one inter-op thread would deadlock the worker.
        config.intra_op_parallelism_threads = cfg["threads"]
    label = f"{cluster.task_type} {cluster.task_index}"
    server = tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=cluster.task_type,
                                  task_index=cluster.task_index, protocol="grpc",
                                  config=config, start=True)
    address = spec[cluster.task_type][cluster.task_index]
    print(f"tfdist: {label} serving at {address} (pid {os.getpid()}); waiting for the "
          "coordinator", flush=True)
    threading.Thread(target=_watch_chief, args=(spec["chief"][0], label), daemon=True).start()
    server.join()
