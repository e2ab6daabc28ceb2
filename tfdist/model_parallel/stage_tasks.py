"""Pipeline stage tasks: stages in processes of their own (`--strategy pipeline` on a cluster).

Each task of the job holds one stage: its layers' weights, their optimizer
slots, and the compute of its forward and backward passes. The chief (task 0)
holds stage 0 and also drives the run: it joins TensorFlow's distributed
runtime (`tf.config.experimental_connect_to_cluster`) as task 0, so that the
one-process `PipelineModel`, given the tasks' devices instead of logical
CPUs, builds and runs each stage on its task; the tensors crossing a cut
travel by TensorFlow's gRPC. The other tasks run a `tf.distribute.Server`
and serve until the chief has gone (`tfdist.ps.server`).

Rules the tasks depend on: a stage's backward is computed under its own
device (each `Stage` keeps its own tape), or every gradient op runs on the
client; a stage task needs two inter-op threads even on one core
(`inter_op_threads`). No transport of tfdist's own.

Pure functions here, and `connect` / `serve`, which import TensorFlow when called.
"""

from __future__ import annotations

import os
import time

from tfdist.errors import ClusterError, ConfigError

JOB = "worker"


def task_device(index: int, device: int = 0) -> str:
    """Pure function: CPU `device` of task `index` in the pipeline's cluster."""
    return f"/job:{JOB}/replica:0/task:{index}/device:CPU:{device}"


def layout(num_tasks: int, stages: int = 0) -> tuple[int, int]:
    """Pure function: (stages P, data-parallel copies C) of a job of P*C tasks.

    Task c*P + s holds stage s of copy c; the chief (task 0) holds stage 0 of copy 0.

    Args:
        num_tasks: The job's processes.
        stages: Stages asked for (0: one per task, a single copy).

    Raises:
        ConfigError: when `stages` is below 2 or does not divide the tasks.
    """
    stages = stages or num_tasks
    if stages < 2 or num_tasks % stages:
        raise ConfigError(
            f"--stages {stages} on {num_tasks} task(s): a pipeline across processes runs one "
            f"stage per task, in copies of --stages tasks each, so --stages must be at least 2 "
            f"and divide the number of tasks ({num_tasks}). Start a multiple of {stages} tasks "
            "(python -m tfdist.launch -n N -- ...), or leave --stages out (one copy, a stage "
            "per task).")
    return stages, num_tasks // stages


def stage_name(task: int, num_tasks: int, stages: int = 0) -> tuple[str, int]:
    """Pure function: (job, index) naming task `task` in messages, by copy and stage.

    One copy: ("pipeline stage", task). Several: ("pipeline copy C stage", S),
    so that task 2 of 2 stages x 2 copies reads "pipeline copy 1 stage 0", not
    "pipeline stage 2" (there is none).
    """
    p, copies = layout(num_tasks, stages)
    if copies == 1:
        return "pipeline stage", task
    return f"pipeline copy {task // p} stage", task % p


def stage_devices(num_tasks: int, stages: int = 0, tensor_parallel: int = 1) -> list[str]:
    """Pure function: every task's devices, copy-major (copy c's stage s is task c*P + s).

    Under tensor parallelism T, each task offers T CPU devices (`serve`), its
    stage's shards, listed together: [task 0's CPU:0 .. CPU:T-1, task 1's, ...].
    """
    layout(num_tasks, stages)
    return [task_device(t, d) for t in range(num_tasks) for d in range(tensor_parallel)]


def check_batch(global_batch_size: int, copies: int, microbatches: int) -> int:
    """Pure function: the rows of one micro-batch of one copy, checked before TensorFlow.

    Each of the C copies takes 1/C of every batch and cuts it into M equal
    micro-batches (equal parts keep the summed gradient the batch's), so the
    batch must divide by C * M.

    Raises:
        ConfigError: naming the batch, the copies and micro-batches, and
            batches and micro-batch counts that divide.
    """
    parts = copies * microbatches
    if microbatches >= 1 and global_batch_size % parts == 0:
        return global_batch_size // parts
    split = " x ".join([*([f"{copies} data-parallel copies"] if copies > 1 else []),
                        *([f"{microbatches} micro-batches"] if microbatches > 1 else [])])
    lower = global_batch_size - global_batch_size % parts
    near = " or ".join(str(b) for b in (lower, lower + parts) if b > 0)
    fits = [m for m in range(1, microbatches + 1) if global_batch_size % (copies * m) == 0]
    fewer = (f", or --microbatches {fits[-1]}" if fits and global_batch_size % copies == 0
             else "")
    raise ConfigError(
        f"--global-batch-size {global_batch_size} cannot be cut into {split} ({parts} equal "
        f"parts): each copy takes an equal share of every batch and cuts it into equal "
        f"micro-batches. Pass a --global-batch-size that is a multiple of {parts} ({near})"
        f"{fewer}.")


def too_many_stages(num_tasks: int, stages: int, most: int) -> str:
    """Pure function: the refusal of a model cut into fewer stages than a job's copies need.

    Across processes every task holds one stage, so the advice is in
    processes and --stages (never --devices or --placement, which name one
    process's devices and are refused here).

    Args:
        num_tasks: The job's processes.
        stages: The stages per copy asked (P).
        most: The most stages the model can be cut into.
    """
    fits = [s for s in range(2, most + 1) if num_tasks % s == 0]
    keep = (f", or keep {num_tasks} processes with --stages {fits[-1]} ({num_tasks // fits[-1]} "
            f"data-parallel copies of {fits[-1]} stages)" if fits else "")
    fewer = (f"Start {most} processes (python -m tfdist.launch -n {most} -- ...)"
             if most >= 2 else "Train it in one process (--strategy single)")
    return (f"Cannot split the model into {stages} stages: it can be cut into at most {most}, "
            f"and across processes each of the {num_tasks} tasks holds one stage. {fewer}"
            f"{keep}.")


def check_cluster(cluster) -> None:
    """Pure check: the cluster can hold one stage per task.

    Raises:
        ConfigError: for ps tasks in the cluster, or ranks started by horovodrun/mpirun
            (their processes have no TensorFlow server addresses).
    """
    spec = (cluster.tf_config or {}).get("cluster", {})
    if cluster.source == "horovod" or not cluster.worker_addresses:
        raise ConfigError(
            f"--strategy pipeline across processes needs each task's address (TF_CONFIG, "
            f"Slurm, or tfdist.launch), but this job was started by {cluster.origin}, which "
            "gives none. Start it with python -m tfdist.launch -n P -- python -m tfdist.train "
            "RECIPE --strategy pipeline, or under Slurm.")
    if spec.get("ps"):
        raise ConfigError(
            f"--strategy pipeline runs one stage per task, but the cluster also lists "
            f"{len(spec['ps'])} ps task(s) (from {cluster.origin}). Start the job without "
            "--ps, or use --strategy parameter_server.")


def check_options(cluster, stages: int, devices: int, tensor_parallel: int,
                  placement: str) -> list[str]:
    """Pure check of the pipeline options across processes; the stage devices.

    Raises:
        ConfigError: for an option that has no meaning across processes.
    """
    check_cluster(cluster)
    p, _ = layout(cluster.num_tasks, stages)
    if devices and devices != p:
        raise ConfigError(
            f"--devices {devices} splits one process's CPU; across processes each of the "
            f"{cluster.num_tasks} tasks is a stage. Pass --devices 0 (a recipe may set it) or "
            f"--devices {p}.")
    if placement:
        raise ConfigError(
            "--placement names one process's devices; across processes the stages are cut "
            "evenly, one per task. Drop --placement.")
    return stage_devices(cluster.num_tasks, stages, tensor_parallel)


def wait_for(addresses: list[str], timeout_s: float, poll_s: float = 0.5) -> None:
    """Waits until every address accepts a TCP connection.

    Raises:
        ClusterError: naming the tasks still down after `timeout_s` (0: wait for ever).
    """
    from tfdist.ps.net import reachable

    deadline = time.monotonic() + timeout_s if timeout_s else None
    waiting = list(addresses)
    while waiting:
        waiting = [a for a in waiting if not reachable(a)]
        if not waiting:
            return
        if deadline is not None and time.monotonic() >= deadline:
            raise ClusterError(
                f"pipeline stage task(s) at {', '.join(waiting)} did not start within "
                f"{timeout_s:g} s (--startup-timeout-s). Check that every task was started "
                "with the same TF_CONFIG cluster.")
        time.sleep(poll_s)


def lost_stage(cluster, reachable=None, stages: int = 0):
    """The `PeerLostError` (rank, address) of the first other stage task whose port is closed.

    Named by `stage_name`: with copies, `job` says the copy and `rank` is the
    stage within it.

    Args:
        cluster: The chief's ClusterInfo.
        reachable: address -> bool (default: one TCP connect); pure when given.
        stages: --stages (0: one stage per task).

    Returns:
        The error, or None when every stage still accepts connections (a hung
        stage does: the kernel answers for a stopped process).
    """
    from tfdist.errors import PeerLostError

    if reachable is None:
        from tfdist.ps.net import reachable
    for task, address in enumerate(cluster.worker_addresses):
        if task != cluster.worker_index and not reachable(address):
            job, rank = stage_name(task, len(cluster.worker_addresses), stages)
            return PeerLostError(f"{job} {rank} at {address} is gone", rank=rank,
                                 address=address, job=job)
    return None


def answers(device: str, timeout_s: float) -> bool:
    """Whether the task of `device` runs a tiny op within `timeout_s` (any reply counts).

    Run from a thread of its own while a step may be waiting on that task: a
    stopped process keeps its port open (its kernel still accepts), so only an
    op shows it has stopped answering.
    """
    import threading

    import tensorflow as tf

    replied = []

    def probe():
        try:
            with tf.device(device):
                tf.reduce_sum(tf.ones([2])).numpy()
        except Exception:  # noqa: BLE001  an error is a reply too (a dead task fails fast)
            pass
        replied.append(True)

    thread = threading.Thread(target=probe, daemon=True, name="tfdist-stage-probe")
    thread.start()
    thread.join(timeout_s)
    return bool(replied)


def hung_stage(cluster, timeout_s: float = 5.0, answers=answers, stages: int = 0):
    """The `PeerLostError` of the first other stage task that does not answer an op in time.

    Args:
        cluster: The chief's ClusterInfo.
        timeout_s: How long each task has to answer.
        answers: (device, timeout_s) -> bool; pure when given.
        stages: --stages (0: one stage per task); names the task (`stage_name`).
    """
    from tfdist.errors import PeerLostError

    for task, address in enumerate(cluster.worker_addresses):
        if task != cluster.worker_index and not answers(task_device(task), timeout_s):
            job, rank = stage_name(task, len(cluster.worker_addresses), stages)
            return PeerLostError(f"{job} {rank} at {address} does not answer",
                                 rank=rank, address=address, job=job)
    return None


def step_overdue(now: float, step_started: float | None, timeout_s: float) -> bool:
    """Pure function: whether a step that started at `step_started` has run too long."""
    return step_started is not None and bool(timeout_s) and now - step_started >= timeout_s


def watchdog(cluster, timeout_s: float, probe_s: float = 5.0, stages: int = 0):
    """A Keras callback on the chief: when a step, or what runs between steps (a
    backup reading every stage's variables), runs `timeout_s` (the collective
    timeout), the stage tasks are checked; a closed port or a task that does not
    answer an op ends the job naming its stage (exit 4, PEER_LOST). A slow step
    whose every stage answers goes on. TensorFlow's remote calls have no deadline
    of their own: a stopped stage would hang the chief for ever.
    """
    import sys
    import threading

    import keras

    from tfdist import exit_codes

    class StageWatchdog(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.started = None
            self.thread = None

        def on_train_begin(self, logs=None):
            if self.thread is None and timeout_s:
                self.thread = threading.Thread(target=self._watch, daemon=True,
                                               name="tfdist-stage-watchdog")
                self.thread.start()

        def on_train_batch_begin(self, batch, logs=None):
            self.started = time.monotonic()

        # Still watched after a step and an epoch: the backup callback comes after this
        # one and reads every stage's variables, and a stage stopped then hung the chief
        # for ever (#29's streamed backup reads them one at a time, a longer window).
        def on_train_batch_end(self, batch, logs=None):
            self.started = time.monotonic()

        def on_epoch_end(self, epoch, logs=None):
            self.started = time.monotonic()

        def on_train_end(self, logs=None):
            self.started = None

        def _watch(self):
            while True:
                time.sleep(min(1.0, timeout_s / 4))
                if not step_overdue(time.monotonic(), self.started, timeout_s):
                    continue
                lost = lost_stage(cluster, stages=stages)
                why = "its process is gone (port closed)"
                if lost is None:
                    lost = hung_stage(cluster, probe_s, stages=stages)
                    why = f"it did not answer an op in {probe_s:g} s (stopped or hung)"
                if lost is None:  # every stage answers: a slow step, not a lost one
                    self.started = time.monotonic()
                    continue
                print(f"error: lost contact with {lost.job} {lost.rank} ({lost.address}) "
                      f"during training: no step or backup finished in {timeout_s:g} s "
                      f"(--collective-timeout-s) and {why}. Rerun the same command to resume "
                      "from the newest backup.", file=sys.stderr, flush=True)
                sys.stdout.flush()
                os._exit(exit_codes.PEER_LOST)  # the main thread waits in TensorFlow

    return StageWatchdog()


MIN_INTER_OP_THREADS = 2


def inter_op_threads(requested: int, cpus: int) -> int:
    """Pure function: the inter-op threads of a pipeline's tasks.

    At least two, even on one core (a task bound to a core, a Slurm task with one
    CPU). When an op finishes, TensorFlow's executor runs one expensive ready
    successor on the same thread and queues the others to the inter-op pool
    (`ExecutorState::ScheduleReady`; a `_Send` counts as expensive). A stage's
    next forward waits for its last one by a control edge, which the executor
    visits after the data edge to the `_Send`, so the next forward ran on and
    the send waited in the queue: with one thread, every micro-batch's send to
    the next stage waited until the stage's last forward had run, and stage 1
    started after stage 0's eighth forward instead of its first (a per-op
    timeline of both tasks, 2 stage processes on a core each, M = 8). The
    chief's setting reaches every stage task: TensorFlow starts their eager
    contexts with its session config (a second thread appeared in stage 1's
    timeline too). tests/integration/test_stage_sends.py shows both, traced.

    Args:
        requested: `--inter-op-threads` (0: not given); kept when given.
        cpus: The cores this process may run on.
    """
    if requested:
        return requested
    return max(MIN_INTER_OP_THREADS, cpus)


def connect(cluster, startup_timeout_s: float, tensor_parallel: int = 1) -> None:
    """Joins the chief to the stage tasks' servers as task 0 (before any op).

    Also gives every task at least two inter-op threads (`inter_op_threads`),
    unless `--inter-op-threads` was given, and the chief T logical CPUs for
    its tensor-parallel stage (the other tasks offer theirs in `serve`).

    Raises:
        ClusterError: when a stage task does not come up in time.
    """
    import tensorflow as tf

    if tensor_parallel > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * tensor_parallel)
    threads = tf.config.threading
    threads.set_inter_op_parallelism_threads(inter_op_threads(
        threads.get_inter_op_parallelism_threads(), len(os.sched_getaffinity(0))))
    addresses = cluster.worker_addresses
    wait_for([a for i, a in enumerate(addresses) if i != cluster.worker_index],
             startup_timeout_s)
    tf.config.experimental_connect_to_cluster(
        tf.train.ClusterSpec({JOB: addresses}), job_name=JOB,
        task_index=cluster.worker_index, protocol="grpc")


def tell_finished(cluster) -> int:
    """The chief, at the end of a run that finished: tells every stage task, so that it
    ends quietly when the chief has gone (`tfdist.ps.server.tell_finished`)."""
    from tfdist.ps import server

    addresses = cluster.worker_addresses
    return server.tell_finished(addresses[0], [  # the address every stage watches
        (task_device(t), a) for t, a in enumerate(addresses) if t != cluster.worker_index])


def serve(cluster, threads: int = 0, startup_timeout_s: float = 0, stages: int = 0,
          tensor_parallel: int = 1) -> None:
    """Runs this task's stage server until the chief has gone (never returns).

    SIGTERM and Ctrl-C do not end a stage: the chief saves its backup at the
    next step, which needs every stage; the stage then ends with the chief.
    """
    from tfdist.ps import server

    addresses = cluster.worker_addresses
    job, rank = stage_name(cluster.worker_index, len(addresses), stages)
    server.serve_spec({JOB: addresses}, JOB, cluster.worker_index, addresses[0],
                      label=f"{job} {rank}",
                      threads=threads, start_s=startup_timeout_s or None,
                      gone_s=server.STAGE_GONE_S, hold_signals=True,
                      cpu_devices=tensor_parallel)
