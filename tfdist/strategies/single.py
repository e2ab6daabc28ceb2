"""`single`: one replica on one device (TensorFlow's default strategy)."""

from __future__ import annotations


def build(cluster, options):
    """Returns the default strategy: no replication, no overhead."""
    import tensorflow as tf

    return tf.distribute.get_strategy()
