"""What a `keras.distribution.Distribution` becomes on TensorFlow: one of tfdist's engines.

* `DataParallel` (and a `ModelParallel` whose model axis has one device):
  in one process a MirroredStrategy over the mesh's devices; over several
  processes (after `initialize()`) tfdist's multi_worker engine. Its scope is
  entered when the distribution is set, so the model's variables are made
  as the strategy's, as Keras's JAX backend lays them out when they are made.
* `ModelParallel` with a model axis of several devices, in one process: when
  the model first trains, evaluates or predicts, tfdist makes a tensor-parallel
  copy of it (`tfdist.keras_distribution.split`) from the layout map; the
  model's weights go into the copy before each call and come back after
  `fit`, so the model the user holds is the one that trained.

The chief prints one line saying what the distribution became.
"""

from __future__ import annotations

import numpy as np

from tfdist.errors import ConfigError
from tfdist.keras_distribution import backend

# The strategy scope entered for the distribution set now: (distribution, strategy, scope).
_ACTIVE: dict = {"distribution": None, "strategy": None, "scope": None, "said": set()}


def say(line: str) -> None:
    """Prints `line` on the chief (process 0), once per distinct line."""
    if backend.process_id() == 0 and line not in _ACTIVE["said"]:
        _ACTIVE["said"].add(line)
        print(f"tfdist: {line}", flush=True)


def tf_device(name: str) -> str:
    """A Keras device name ("cpu:1") as TensorFlow writes it ("/device:CPU:1")."""
    if name.startswith("/"):
        return name
    kind, _, index = name.partition(":")
    return f"/device:{kind.upper()}:{index or 0}"


def mesh_sizes(distribution) -> dict[str, int]:
    """Mesh axis name -> devices along it."""
    mesh = distribution.device_mesh
    return dict(zip(mesh.axis_names, (int(s) for s in mesh.shape)))


def model_axis(distribution) -> tuple[str | None, int]:
    """(name, size) of the mesh axis that is not the batch axis (None, 1 when there is none)."""
    others = [(a, s) for a, s in mesh_sizes(distribution).items()
              if a != distribution.batch_dim_name]
    if len(others) > 1:
        raise ConfigError(
            f"A mesh of axes {list(mesh_sizes(distribution))} has {len(others)} axes beside the "
            f"batch axis {distribution.batch_dim_name!r}; tfdist takes one model axis.")
    return others[0] if others else (None, 1)


def is_split(distribution) -> bool:
    """Whether `distribution` splits weights over devices (a ModelParallel model axis > 1)."""
    from keras.distribution import ModelParallel

    return isinstance(distribution, ModelParallel) and model_axis(distribution)[1] > 1


def on_set(distribution) -> None:
    """Makes `distribution` (or None) current: leaves the previous strategy scope, enters its own."""
    if distribution is _ACTIVE["distribution"]:
        return
    scope = _ACTIVE["scope"]
    _ACTIVE.update(distribution=None, strategy=None, scope=None)
    if scope is not None:
        scope.__exit__(None, None, None)
    if distribution is None:
        return
    _ACTIVE["distribution"] = distribution
    if is_split(distribution):
        _check_model_parallel(distribution)
        return  # split when the model first runs (`tfdist.keras_distribution.split`)
    strategy, what = _data_parallel_strategy(distribution)
    scope = strategy.scope()
    scope.__enter__()
    _ACTIVE.update(strategy=strategy, scope=scope)
    say(f"keras.distribution.{type(distribution).__name__} -> {what}, "
        f"num_replicas={strategy.num_replicas_in_sync}, processes={backend.num_processes()}")


def _check_model_parallel(distribution) -> None:
    """A split model in one process, with one copy: refused otherwise, before anything trains."""
    batch = mesh_sizes(distribution).get(distribution.batch_dim_name, 1)
    axis, size = model_axis(distribution)
    if backend.num_processes() > 1:
        raise ConfigError(
            f"ModelParallel over {backend.num_processes()} processes: tfdist splits weights "
            f"over one process's devices only (mesh {mesh_sizes(distribution)}). Use "
            "DataParallel across processes, or ModelParallel in one process.")
    if batch > 1:
        raise ConfigError(
            f"ModelParallel on a mesh of {batch} copies x {size} devices along {axis!r} in one "
            "process: tfdist splits one copy of the model over the model axis. Give the batch "
            "axis 1 device (a (1, N) mesh), or use DataParallel.")


def _data_parallel_strategy(distribution):
    """(strategy, what it is) for a distribution that keeps every weight whole."""
    devices = [str(d) for d in np.asarray(distribution.device_mesh.devices).flatten()]
    dist = backend.distributed()
    if dist is not None:
        expected = backend.list_devices()
        if sorted(devices) != sorted(expected):
            raise ConfigError(
                f"A DataParallel mesh over {devices} in a job of {dist.num_workers} processes: "
                f"tfdist's multi_worker engine trains on every process's device, {expected}. "
                "Build the mesh from keras.distribution.list_devices().")
        return dist.strategy, "multi_worker (MultiWorkerMirroredStrategy)"
    from tfdist.strategies import mirrored

    return (mirrored.build_on([tf_device(d) for d in devices]),
            f"mirrored over {', '.join(devices)}")


def current():
    """The distribution set now, as tfdist sees it (None: none)."""
    return _ACTIVE["distribution"]


def strategy():
    """The tf.distribute strategy of the distribution set now (None for a split model)."""
    return _ACTIVE["strategy"]


def distribute_dataset(distribution, dataset, keras_part):
    """What TensorFlow's multi-worker strategy is given for a global-batch `dataset`.

    Keras's `distribute_dataset` gives each process its rows of each global
    batch (`keras_part`: rebatched to the process's share, then every P-th
    part). TensorFlow's strategy would split that again, and a dataset it
    cannot count makes it run one extra, empty step at the end of an epoch
    (Adam moves on zero gradients). So it gets the global-batch dataset and
    cuts the same rows itself, sharded by data (`AutoShardPolicy.DATA`), with
    the number of steps known. A dataset the user sharded already
    (`auto_shard_dataset=False`) is handed on as this process's part.
    """
    strategy_now = _ACTIVE["strategy"]
    if (strategy_now is None or backend.num_processes() == 1
            or distribution is not _ACTIVE["distribution"]):
        return keras_part
    import tensorflow as tf

    if not distribution.auto_shard_dataset:
        # multi_worker has one replica per process: this process's rows are its replica's.
        return strategy_now.distribute_datasets_from_function(lambda context: keras_part)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return strategy_now.experimental_distribute_dataset(dataset.with_options(options))
