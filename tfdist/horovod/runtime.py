"""Importing, initialising and pinning Horovod, with one install hint.

Horovod is optional: nothing here is imported until the `horovod` strategy
or `tfdist.horovod` is used, and a missing install fails with one message.
"""

from __future__ import annotations

import importlib.util

from tfdist.errors import ConfigError

INSTALL_HINT = (
    "HINT: run `scripts/install_horovod.sh` (builds horovod 0.28.1 with Gloo and MPI against "
    "tensorflow-cpu 2.18.1 in its own venv, ~/.cache/tfdist/horovod-venv, and caches the wheel), "
    "then start ranks with that venv's `horovodrun`; or `pip install 'tfdist[horovod]'` into an "
    "environment whose TensorFlow is 2.16-2.18 (horovod 0.28.1 does not compile against newer).")


def is_available() -> bool:
    """True when `horovod.tensorflow` can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec("horovod") is not None and \
            importlib.util.find_spec("horovod.tensorflow") is not None
    except (ImportError, ValueError):
        return False


def require() -> None:
    """Raises ConfigError with the install hint when Horovod is missing."""
    if not is_available():
        raise ConfigError(f"--strategy horovod needs Horovod, which is not installed in this "
                          f"Python ({_python()}).\n{INSTALL_HINT}")


def _python() -> str:
    import sys

    return sys.executable


def hvd():
    """Returns `horovod.tensorflow`, initialised.

    Raises:
        ConfigError: when Horovod is not installed, or its TensorFlow
            extension does not load (built against another TensorFlow).
    """
    require()
    try:
        import horovod.tensorflow as hvd_tf
    except ImportError as e:  # e.g. an extension built for another TensorFlow
        raise ConfigError(f"Horovod is installed but `import horovod.tensorflow` failed: {e}\n"
                          f"{INSTALL_HINT}") from None
    if not hvd_tf.is_initialized():
        hvd_tf.init()
    return hvd_tf


def gpu_for_local_rank(num_gpus: int, local_rank: int) -> int | None:
    """Pure function: the GPU index a rank uses, or None on a CPU-only host.

    One rank per GPU; ranks beyond the GPU count share them round robin
    (oversubscription is legal, if slow).
    """
    if num_gpus <= 0:
        return None
    return local_rank % num_gpus


def pin_device(local_rank: int) -> int | None:
    """Makes only this rank's GPU visible (before TensorFlow's runtime starts).

    Returns:
        The GPU index used, or None without GPUs.
    """
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    index = gpu_for_local_rank(len(gpus), local_rank)
    if index is not None:
        tf.config.experimental.set_memory_growth(gpus[index], True)
        tf.config.set_visible_devices(gpus[index], "GPU")
    return index
