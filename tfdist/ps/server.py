"""Workers and parameter servers: a `tf.distribute.Server` that waits for work.

A server has no training loop of its own: the coordinator sends it functions
(workers) or keeps variables on it (ps). TensorFlow's `Server.join()` never
returns, so a server whose coordinator died would wait forever; a watchdog
thread ends it once the chief has not answered for a bounded time: CHIEF_GONE_S
after it was last seen up, or CHIEF_START_S after this server started when it
was never seen (a chief that died before, or just after, opening its port).

A chief that finished its run says so first (`tell_finished`): an op on each
serving task's device writes a marker file on that task's host
(`finished_marker`), and the task then ends without a word once the chief's
port closes. Without the marker (the chief failed, was killed, or vanished),
the task says the chief has gone.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import tempfile
import threading
import time

from tfdist.ps.net import reachable

CHIEF_POLL_S = 1.0
CHIEF_GONE_S = 6.0    # unreachable this long after it was up: finished or failed
CHIEF_START_S = 15.0  # never reachable this long after this server started
# A pipeline stage's chief refuses connections once its process has ended: a
# short wait, so the job ends soon after its chief (a busy chief still accepts).
STAGE_GONE_S = 2.0


def chief_gone(now: float, started: float, last_seen: float | None,
               start_s: float | None = CHIEF_START_S, gone_s: float = CHIEF_GONE_S) -> bool:
    """Pure function: whether the chief counts as gone at `now` (monotonic seconds).

    `start_s` None: a chief never seen is waited for without end.
    """
    if last_seen is None:
        return start_s is not None and now - started >= start_s
    return now - last_seen >= gone_s


def finished_marker(chief: str, task: str, directory: str | None = None) -> str:
    """Pure function (given `directory`): the file whose presence on the host of the task
    at `task` says that the chief at `chief` finished its run.

    Args:
        chief, task: "host:port" addresses, as in the cluster spec.
        directory: Where (default: this host's temporary directory; the chief and its
            tasks must agree, as they do on one host or with the same TMPDIR).
    """
    def safe(address):
        return re.sub(r"[^A-Za-z0-9.-]", "_", address)

    return os.path.join(directory or tempfile.gettempdir(),
                        f"tfdist-finished-{safe(chief)}-{safe(task)}")


def _take(marker: str | None) -> bool:
    """Whether `marker` exists; removes it."""
    if marker is None:
        return False
    try:
        os.remove(marker)
        return True
    except OSError:
        return os.path.exists(marker)


def tell_finished(chief: str, tasks: list[tuple[str, str]], timeout_s: float = 10.0) -> int:
    """The chief, at the end of a run that finished: tells each serving task so, so that it
    ends quietly once the chief has gone (`finished_marker`, written by an op on the task's
    own device, so on its own host).

    Args:
        chief: This chief's address, as its tasks watch it.
        tasks: (device, address) of each serving task.
        timeout_s: How long all the writes may take (a remote call has no deadline of its
            own; a task that does not answer says "has gone" at the end, as before).

    Returns:
        How many tasks were told.
    """
    import tensorflow as tf

    told = []

    def write():
        for device, address in tasks:
            if not reachable(address):
                continue
            try:
                with tf.device(device):
                    tf.io.write_file(finished_marker(chief, address), "")
                told.append(address)
            except Exception:  # noqa: BLE001  a task that cannot be told says "has gone"
                pass

    thread = threading.Thread(target=write, daemon=True, name="tfdist-tell-finished")
    thread.start()
    thread.join(timeout_s)
    return len(told)


def _watch_chief(address: str, label: str, start_s: float | None = CHIEF_START_S,
                 gone_s: float = CHIEF_GONE_S, marker: str | None = None) -> None:
    from tfdist.ps import EXIT_LOST_CHIEF

    started, last_seen = time.monotonic(), None
    while True:
        time.sleep(CHIEF_POLL_S)
        if reachable(address):
            last_seen = time.monotonic()
            continue
        if last_seen is not None and _take(marker):  # the chief finished, and said so
            sys.stdout.flush()
            os._exit(EXIT_LOST_CHIEF)
        if chief_gone(time.monotonic(), started, last_seen, start_s, gone_s):
            what = ("has gone (finished or failed)" if last_seen is not None else
                    f"did not answer within {start_s:g} s of this task starting")
            print(f"tfdist: {label}: the chief at {address} {what}; this task has nothing "
                  "left to serve and exits.", flush=True)
            sys.stdout.flush()
            os._exit(EXIT_LOST_CHIEF)  # join() cannot be interrupted otherwise


def serve(cluster, threads: int = 0):
    """Starts this task's server and blocks until the chief has gone.

    Args:
        cluster: ClusterInfo of a worker or ps task.
        threads: Intra-op threads (0: TensorFlow's default).
    """
    spec = {k: v for k, v in cluster.tf_config["cluster"].items()
            if k in ("chief", "worker", "ps")}
    serve_spec(spec, cluster.task_type, cluster.task_index, spec["chief"][0],
               label=f"{cluster.task_type} {cluster.task_index}", threads=threads)


def serve_spec(spec: dict, job: str, index: int, chief: str, *, label: str, threads: int = 0,
               start_s: float | None = CHIEF_START_S, gone_s: float = CHIEF_GONE_S,
               hold_signals: bool = False, cpu_devices: int = 1) -> None:
    """Serves task `index` of `job` in cluster `spec` until the chief at `chief` has gone.

    Args:
        spec: job -> task addresses.
        job, index: This task.
        chief: The chief's "host:port", watched.
        label: This task in messages ("worker 1", "pipeline stage 1").
        threads: Intra-op threads (0: TensorFlow's default).
        start_s, gone_s: See `chief_gone`.
        cpu_devices: CPU devices this task offers (a tensor-parallel stage's shards
            on a machine without GPUs: CPU:0 .. CPU:N-1, one CPU split).
        hold_signals: SIGTERM and SIGINT do not end this task (its chief saves a
            backup with it first); it ends when the chief has gone, and at once,
            without a word, when the chief is gone already (it refused the run:
            nothing trained, nothing to save).
    """
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto()
    if threads:
        # Intra-op only: a remote step blocks an inter-op thread while it waits
        # for its input, so one inter-op thread would deadlock the worker.
        config.intra_op_parallelism_threads = threads
    if cpu_devices > 1:  # a server offers its session config's devices, not logical ones
        config.device_count["CPU"] = cpu_devices
    server = tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=job, task_index=index,
                                  protocol="grpc", config=config, start=True)
    if hold_signals:
        def held(signum, frame):
            if not reachable(chief):  # no chief to save anything (it refused, or ended)
                from tfdist.ps import EXIT_LOST_CHIEF

                os._exit(EXIT_LOST_CHIEF)
            print(f"tfdist: {label}: {signal.Signals(signum).name} received; serving until the "
                  "chief, which saves the backup, has ended", flush=True)

        signal.signal(signal.SIGTERM, held)
        signal.signal(signal.SIGINT, held)
    print(f"tfdist: {label} serving at {spec[job][index]} (pid {os.getpid()}); waiting for the "
          "coordinator", flush=True)
    marker = finished_marker(chief, spec[job][index])
    _take(marker)  # an earlier job's, on the same ports
    threading.Thread(target=_watch_chief, args=(chief, label, start_s, gone_s, marker),
                     daemon=True).start()
    # The server serves from its own threads (kept alive by `server`); a sleep, not
    # join(), so that Python's signal handlers run in this thread.
    while server is not None:
        time.sleep(3600)
