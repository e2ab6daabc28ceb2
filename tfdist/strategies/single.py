"""`single`: one replica on one device (TensorFlow's default strategy)."""

from __future__ import annotations

from tfdist.strategies import Adapter, register


def build(cluster, options):
    """Returns the default strategy: no replication, no overhead."""
    import tensorflow as tf

    return tf.distribute.get_strategy()


@register
class Single(Adapter):
    """One replica on one device."""

    name = "single"
    portable = True
    one_process = True

    def build(self):
        return build(self.cluster, self.options)
