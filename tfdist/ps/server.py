"""Workers and parameter servers: a `tf.distribute.Server` that waits for work.

A server has no training loop of its own: the coordinator sends it functions
(workers) or keeps variables on it (ps). TensorFlow's `Server.join()` never
returns, so a server whose coordinator died would wait forever; a watchdog
thread ends it once the chief has not answered for a bounded time: CHIEF_GONE_S
after it was last seen up, or CHIEF_START_S after this server started when it
was never seen (a chief that died before, or just after, opening its port).
"""

from __future__ import annotations

import os
import sys
import threading
import time

from tfdist.ps.net import reachable

CHIEF_POLL_S = 1.0
CHIEF_GONE_S = 6.0    # unreachable this long after it was up: finished or failed
CHIEF_START_S = 15.0  # never reachable this long after this server started


def chief_gone(now: float, started: float, last_seen: float | None) -> bool:
    """Pure function: whether the chief counts as gone at `now` (monotonic seconds)."""
    if last_seen is None:
        return now - started >= CHIEF_START_S
    return now - last_seen >= CHIEF_GONE_S


def _watch_chief(address: str, label: str) -> None:
    from tfdist.ps import EXIT_LOST_CHIEF

    started, last_seen = time.monotonic(), None
    while True:
        time.sleep(CHIEF_POLL_S)
        if reachable(address):
            last_seen = time.monotonic()
            continue
        if chief_gone(time.monotonic(), started, last_seen):
            what = ("has gone (finished or failed)" if last_seen is not None else
                    f"did not answer within {CHIEF_START_S:g} s of this task starting")
            print(f"tfdist: {label}: the chief at {address} {what}; this task has nothing "
                  "left to serve and exits.", flush=True)
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
