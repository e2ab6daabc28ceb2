"""Local device set-up that must happen before TensorFlow's runtime starts."""

from __future__ import annotations

from tfdist.errors import ConfigError


def configure_runtime(cpu_devices: int | None = None, intra_op_threads: int | None = None,
                      inter_op_threads: int | None = None) -> None:
    """Splits the CPU into logical devices and sets thread pools.

    Must run before the first op executes; TensorFlow refuses both changes
    once its runtime is initialized.

    Args:
        cpu_devices: Split the (first) CPU into this many logical devices, so
            that MirroredStrategy on a CPU-only machine has real replicas.
        intra_op_threads: Threads per op; 1 gives each worker a fair share.
        inter_op_threads: Threads running independent ops.

    Raises:
        ConfigError: when asked for fewer than one device.
        RuntimeError: when TensorFlow's runtime was already initialized.
    """
    import tensorflow as tf

    if cpu_devices is not None:
        if cpu_devices < 1:
            raise ConfigError(f"devices must be >= 1. Received: devices={cpu_devices}.")
        cpu = tf.config.list_physical_devices("CPU")[0]
        current = tf.config.get_logical_device_configuration(cpu)
        if cpu_devices > 1 and (current is None or len(current) != cpu_devices):
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * cpu_devices)
    if intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)
    if inter_op_threads:
        tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads)


def cpu_split(devices: int) -> int | None:
    """The logical CPU devices `--devices` asks for (`configure_runtime`'s `cpu_devices`):
    `devices` when more than one and there is no GPU, else None (no split)."""
    return devices if devices > 1 and gpu_count() == 0 else None


def gpu_count() -> int:
    """Number of physical GPUs, without starting the runtime."""
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))


def local_devices(count: int | None) -> list[str]:
    """Device names for `count` local replicas (0 or None: all): GPUs if present, else
    logical CPUs.

    Raises:
        ConfigError: when more devices are asked for than exist.
    """
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    pool = gpus or tf.config.list_logical_devices("CPU")
    count = count or len(pool)
    if count > len(pool):
        kind = "GPU" if gpus else "logical CPU"
        raise ConfigError(f"devices={count} but this machine has {len(pool)} {kind} device(s): "
                          f"{[d.name for d in pool]}. Pass --devices {len(pool)} or fewer.")
    return [d.name for d in pool[:count]]
