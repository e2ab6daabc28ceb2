"""Asynchronous parameter-server training (`--strategy parameter_server`).

One command for every task: `python -m tfdist.train RECIPE --strategy
parameter_server` started with a TF_CONFIG that lists a chief, workers and ps
tasks (by `tfdist.launch --ps N --workers M`, by hand, or from Slurm) looks at
its own role:

* ``worker`` and ``ps`` tasks run a `tf.distribute.Server` (`server.py`);
* the ``chief`` is the coordinator: it owns the variables' placement, schedules
  training steps on the workers and writes the model dir (the run pipeline's
  `tfdist.run.coordinator`).

This package keeps the servers, their networking and the pure checks; it
imports nothing of the run pipeline.
"""

from __future__ import annotations

from tfdist.errors import ClusterError, ConfigError
from tfdist.ps.net import reachable  # noqa: F401  (tfdist.ps.reachable)

EXIT_LOST_CHIEF = 0  # a server whose chief is gone has nothing left to do


def check_cluster(cluster) -> None:
    """Pure check that the cluster can run parameter-server training.

    Raises:
        ClusterError: naming what the cluster spec holds and what is missing.
    """
    spec = (cluster.tf_config or {}).get("cluster", {})
    counts = {k: len(spec.get(k, [])) for k in ("chief", "worker", "ps")}
    if counts["chief"] == 1 and counts["worker"] >= 1 and counts["ps"] >= 1:
        return
    raise ClusterError(
        "strategy parameter_server needs one 'chief', at least one 'worker' and at least "
        f"one 'ps' task in the cluster. Received: {counts} (source={cluster.source}).\n"
        "HINT: on one machine: python -m tfdist.launch --ps 1 --workers 2 -- python -m "
        "tfdist.train RECIPE --strategy parameter_server; under Slurm set TFDIST_NUM_PS.")


def check_partitioning(ps_shards: int) -> None:
    """Refuses variable partitioning for Keras 3 models (pure check, before TensorFlow).

    ParameterServerStrategy's partitioner turns a big variable into a
    `ShardedVariable`, but a Keras 3 variable wrapping one cannot be
    differentiated: `keras/src/backend/tensorflow/core.py` `Variable.handle`
    returns `self.value.handle` and ShardedVariable has no `handle` (measured:
    `AttributeError: 'ShardedVariable' object has no attribute 'handle'` in
    `tape.gradient`, Keras 3.15.1, TF 2.21). Keras 3 does not support
    parameter-server training at all (keras-team/keras#18624).

    Raises:
        ConfigError: when `ps_shards` > 1.
    """
    if ps_shards > 1:
        raise ConfigError(
            f"--ps-shards {ps_shards}: partitioning variables across ps tasks does not work "
            "with Keras 3 models (a Keras variable over a ShardedVariable has no 'handle', so "
            "gradients fail; keras-team/keras#18624: Keras 3 does not support PS training). "
            "Use --ps-shards 0; `tfdist.strategies.build_strategy('parameter_server', ...)` "
            "still partitions plain tf.Variables for custom TensorFlow code.")
