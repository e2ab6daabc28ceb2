"""The TensorFlow backend of `keras.distribution`, as Keras's other backends have one.

Keras calls these under the same names as `keras/src/backend/jax/distribution_lib.py`;
`tfdist.compat.keras_tf_distribution` puts them on Keras's TensorFlow module,
whose own file is a prototype without them. Devices and processes come from
tfdist's cluster discovery (TF_CONFIG, Slurm, `tfdist.launch`), and the
processes are joined by tfdist's multi_worker engine.
"""

from __future__ import annotations

import json
import os

from tfdist.errors import ConfigError

# After `initialize()` for several processes: this process's ClusterInfo, and the engine
# (a tfdist.Distributed) built when a distribution is first set.
_STATE: dict = {"cluster": None, "dist": None, "runtime": False}


def configure_runtime(wanted: int | None = None) -> None:
    """Splits the CPU into `wanted` (default TFDIST_DEVICES) logical devices, once,
    before TensorFlow's runtime starts."""
    if _STATE["runtime"]:
        return
    _STATE["runtime"] = True
    from tfdist.cluster import local_devices_requested
    from tfdist.strategies import devices

    wanted = local_devices_requested() if wanted is None else wanted
    try:
        devices.configure_runtime(cpu_devices=devices.cpu_split(wanted))
    except RuntimeError:
        if len(_local("CPU")) < wanted:
            raise ConfigError(
                f"{wanted} logical CPU devices were asked for (TFDIST_DEVICES or --devices), "
                "but TensorFlow's runtime started before tfdist could split the CPU. Call "
                "keras.distribution.list_devices() (or initialize()) before any TensorFlow "
                "op.") from None


def _local(device_type: str | None):
    import tensorflow as tf

    return tf.config.list_logical_devices(device_type)


def local_count(kind: str) -> int:
    """This process's devices of `kind`, counted without starting TensorFlow's runtime.

    CPUs: the logical devices the CPU is split into (TFDIST_DEVICES, or a
    split configured by hand), else 1. GPUs: the physical GPUs.
    """
    import tensorflow as tf

    if kind == "GPU":
        return len(tf.config.list_physical_devices("GPU"))
    cpu = tf.config.list_physical_devices("CPU")[0]
    split = tf.config.get_logical_device_configuration(cpu)
    return len(split) if split else 1


def list_devices(device_type=None):
    """This job's devices: GPUs, else CPUs (`TFDIST_DEVICES=N` splits the CPU into N).

    After `initialize()` for several processes, every process's devices,
    named `/job:worker/replica:0/task:T/device:CPU:I`. Counted without
    starting TensorFlow's runtime, so `list_devices()` may come before
    `initialize()` and the engine still starts.

    Args:
        device_type: "cpu" or "gpu"; None: GPUs when there are any, else CPUs.

    Returns:
        Device names, as Keras's `DeviceMesh` takes them.
    """
    import tensorflow as tf

    configure_runtime()
    kind = device_type.upper() if device_type else None
    if kind is None:
        kind = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
    info = _STATE["cluster"]
    if info is not None:
        return [f"/job:worker/replica:0/task:{t}/device:{kind}:{i}"
                for t in range(info.num_workers) for i in range(local_count(kind))]
    return [f"{kind.lower()}:{i}" for i in range(local_count(kind))]


def get_device_count(device_type=None):
    """How many devices `list_devices(device_type)` returns."""
    return len(list_devices(device_type))


def _tf_config_from(job_addresses, num_processes, process_id) -> dict:
    """The TF_CONFIG that Keras's `initialize` arguments describe (pure)."""
    addresses = [a.strip() for a in str(job_addresses).split(",") if a.strip()]
    if num_processes is not None and int(num_processes) != len(addresses):
        raise ConfigError(
            f"keras.distribution.initialize got {len(addresses)} job_addresses {addresses} "
            f"but num_processes={num_processes}: give one host:port per process.")
    if process_id is None or not 0 <= int(process_id) < len(addresses):
        raise ConfigError(
            f"keras.distribution.initialize needs process_id in [0, {len(addresses)}) with "
            f"job_addresses. Received: process_id={process_id}.")
    return {"cluster": {"worker": addresses},
            "task": {"type": "worker", "index": int(process_id)}}


def initialize(job_addresses=None, num_processes=None, process_id=None):
    """Finds this job's processes: the cluster from the arguments, else TF_CONFIG, Slurm
    or `tfdist.launch`. Their engine starts when a distribution is set:
    multi_worker for DataParallel, shm for ModelParallel copies across processes.

    Call it first, before any TensorFlow op (as Keras's documentation says).

    Raises:
        ConfigError: for arguments that do not describe a cluster, or a job
            started by horovodrun (use tfdist.launch, TF_CONFIG or Slurm).
    """
    if _STATE["cluster"] is not None:
        return
    if job_addresses:
        os.environ["TF_CONFIG"] = json.dumps(
            _tf_config_from(job_addresses, num_processes, process_id))
    elif num_processes not in (None, 1):
        raise ConfigError(
            f"keras.distribution.initialize(num_processes={num_processes}) needs job_addresses "
            "(host:port of every process) too, or start the processes with tfdist.launch, "
            "TF_CONFIG or Slurm and call initialize() with no arguments.")
    from tfdist import cluster

    info = cluster.detect()
    if info.source == "horovod":
        raise ConfigError(
            "keras.distribution on TensorFlow joins processes with tfdist's multi_worker "
            "or shm engine; this process was started by horovodrun. Start it with tfdist.launch, "
            "TF_CONFIG or Slurm.")
    if info.num_workers > 1:
        _STATE["cluster"] = info  # the engine starts when a distribution is set (`engine`)
    else:
        configure_runtime()


def start_engine(name: str):
    """The multi-process engine `name` ("multi_worker" or "shm"), started once.

    Raises:
        ConfigError: when another engine already runs, or TensorFlow's runtime
            started before it could (multi_worker must start first).
    """
    dist = _STATE["dist"]
    if dist is not None:
        if dist.name != name:
            raise ConfigError(
                f"This job already trains with tfdist's {dist.name} engine; one process cannot "
                f"also start {name}. Set one kind of distribution per job (DataParallel across "
                "processes: multi_worker; ModelParallel with the batch axis across processes: "
                "shm).")
        return dist
    from tfdist.distributed import setup

    _STATE["runtime"] = True
    try:
        _STATE["dist"] = setup(name)
    except RuntimeError as e:
        raise ConfigError(
            f"tfdist's {name} engine could not start: {str(e).splitlines()[0]}. Call "
            "keras.distribution.initialize() and set_distribution() before any TensorFlow "
            "op.") from None
    return _STATE["dist"]


def distributed():
    """The multi-process `tfdist.Distributed` running now, or None."""
    return _STATE["dist"]


def num_processes():
    """Processes in this job (1 until `initialize()` found several)."""
    info = _STATE["cluster"]
    return info.num_workers if info is not None else 1


def process_id():
    """This process's index (0: the chief)."""
    info = _STATE["cluster"]
    return info.worker_index if info is not None else 0


def distribute_tensor(tensor, layout):
    """`tensor` itself: a relayout hint changes no value, and tfdist's split layers place
    their own outputs (see docs/keras_distribution.md)."""
    return tensor


def distribute_variable(value, layout):
    """`value` itself: tfdist splits weights when the model trains (`ModelParallel`)."""
    return value


def distribute_value(value, tensor_layout):
    """`value` itself (the prototype's name for `distribute_variable`)."""
    return value


def distribute_data_input(per_process_batch, layout, batch_dim_name):
    """This process's batch, as `Distribution.distribute_dataset` made it."""
    return per_process_batch


NAMES = ("list_devices", "get_device_count", "initialize", "num_processes", "process_id",
         "distribute_tensor", "distribute_variable", "distribute_value", "distribute_data_input")
