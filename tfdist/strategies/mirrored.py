"""`mirrored`: one process, one replica per local device (MirroredStrategy)."""

from __future__ import annotations

from tfdist.strategies import Adapter, register
from tfdist.strategies.devices import local_devices


def build(cluster, options):
    """MirroredStrategy over `options.devices` local devices (all when 0).

    On a CPU-only machine the devices are the logical CPUs made by
    `configure_runtime(cpu_devices=N)`, so replication is real and testable.
    """
    from tfdist.compat import keras_grad_reduction

    keras_grad_reduction.set_compression(options.grad_compression)
    return build_on(local_devices(options.devices))


def build_on(devices: list[str]):
    """MirroredStrategy over these TensorFlow device names, tfdist's workarounds applied."""
    import tensorflow as tf

    from tfdist import compat

    compat.apply_all()
    return tf.distribute.MirroredStrategy(devices=devices)


@register
class Mirrored(Adapter):
    """One process, one replica per local device."""

    name = "mirrored"
    portable = True
    one_process = True
    accepts = ("devices", "grad_compression")

    @classmethod
    def check_config(cls, settings, cluster):
        super().check_config(settings, cluster)
        devices = settings.adapter.devices
        if devices > 1:  # the replica count is known before TensorFlow (CPU layouts)
            from tfdist import data

            data.per_replica_batch_size(settings.training.global_batch_size, devices)

    def build(self):
        return build(self.cluster, self.options)
