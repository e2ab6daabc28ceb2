"""What every training loop shares: the run's result, its model dir, `Preempted`.

Both loops (the synchronous `fit` loop in `tfdist.run.trainer` and the
parameter-server coordinator in `tfdist.run.coordinator`) import these from
here, so neither imports the other: the package's import graph stays
acyclic (tests/test_import_graph.py). `tfdist.run.trainer` re-exports them under
their old names. No TensorFlow.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from tfdist import model_dir as model_dir_lib
from tfdist.preemption import Preempted  # noqa: F401  (declared there: strategies raise it too)
from tfdist.cluster import local
from tfdist.cluster.base import ClusterInfo
from tfdist.run import run_dir



@dataclasses.dataclass
class Result:
    """What `train` returns.

    Attributes:
        model: The trained Keras model.
        metrics: The dict written to metrics.json (on every worker).
        strategy: The tf.distribute.Strategy used.
        cluster: The ClusterInfo of this process.
    """

    model: object
    metrics: dict
    strategy: object
    cluster: ClusterInfo


def model_dir_for(cfg: dict, recipe_name: str, cluster=None) -> str:
    """The model dir: `cfg["model_dir"]`, or by default one named from what runs
    (`tfdist.run.run_dir.default_model_dir`; `cluster` None: this machine alone)."""
    from tfdist.settings import Settings

    given = Settings.of(cfg).backup.model_dir
    if given:
        return given
    if cluster is None:
        cluster = ClusterInfo(source="local", num_workers=1, worker_index=0)
    dev = os.listdir("/dev") if os.path.isdir("/dev") else []
    return run_dir.default_model_dir(
        recipe_name, cfg, cluster, local.gpus_possible(os.environ, dev, sys.platform))


def check_free_space(model_dir: str, cluster, model, optimizer) -> None:
    """Chief: refuses to train when one backup and the final model would not fit."""
    if cluster.is_chief:
        model_dir_lib.check_free_space(
            model_dir, model_dir_lib.backup_bytes([*model.variables, *optimizer.variables])
            + model_dir_lib.backup_bytes(model.variables))
