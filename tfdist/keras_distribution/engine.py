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
from tfdist.keras_distribution import backend, layouts

# The strategy scope entered for the distribution set now: (distribution, strategy, scope).
_ACTIVE: dict = {"distribution": None, "strategy": None, "scope": None, "said": set()}


def say(line: str) -> None:
    """Prints `line` on the chief (process 0), once per distinct line."""
    if backend.process_id() == 0 and line not in _ACTIVE["said"]:
        _ACTIVE["said"].add(line)
        print(f"tfdist: {line}", flush=True)


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
    """Makes `distribution` (or None) current: leaves the previous strategy scope, enters its own.

    Everything that may refuse runs first, so a refused distribution leaves
    the previous one current.
    """
    if distribution is _ACTIVE["distribution"]:
        return
    strategy = what = None
    if distribution is not None:
        _check_batch_axis_weights(distribution)
        if is_split(distribution):
            _check_model_parallel(distribution)  # split when the model first runs (`split`)
        else:
            strategy, what = _data_parallel_strategy(distribution)
    if _ACTIVE["scope"] is not None:
        _ACTIVE["scope"].__exit__(None, None, None)
    _ACTIVE.update(distribution=distribution, strategy=strategy, scope=None)
    if strategy is None:
        return
    _ACTIVE["scope"] = strategy.scope()
    _ACTIVE["scope"].__enter__()
    say(f"keras.distribution.{type(distribution).__name__} -> {what}, "
        f"num_replicas={strategy.num_replicas_in_sync}, processes={backend.num_processes()}")


def _check_batch_axis_weights(distribution) -> None:
    """A LayoutMap entry that splits weights over the batch axis is refused (sharded weights,
    ZeRO-3, are not in tfdist yet); a layer output's layout may use it (Keras's guide does)."""
    layout_map = getattr(distribution, "_layout_map", None)
    if layout_map is None:
        return
    for key in layout_map:
        axes = tuple(layout_map[key].axes)
        if distribution.batch_dim_name in axes and not key.endswith("output"):
            raise ConfigError(
                f"The LayoutMap entry {key!r}, {axes}, splits weights over the batch axis "
                f"{distribution.batch_dim_name!r}: that is fully sharded data parallel "
                "(ZeRO-3), which tfdist does not have yet. Leave weights unsplit over the "
                f"batch axis. {layouts.WHAT_WORKS}")


def _check_model_parallel(distribution) -> None:
    """One split copy per process, the copies across processes (shm): refused otherwise,
    before anything trains."""
    batch = mesh_sizes(distribution).get(distribution.batch_dim_name, 1)
    axis, size = model_axis(distribution)
    processes = backend.num_processes()
    if batch != processes:
        raise ConfigError(
            f"ModelParallel on a mesh of {batch} copies x {size} devices along {axis!r}, in "
            f"{processes} process(es): tfdist splits one copy over each process's devices, "
            f"so the batch axis must have {processes} device(s) (one per process); e.g. a "
            f"({processes}, {size}) mesh of keras.distribution.list_devices(), with "
            f"TFDIST_DEVICES={size}. Or use DataParallel.")
    if processes > 1:
        for row in _rows(distribution, axis):
            tasks = {_task_of(d) for d in row}
            if len(tasks) != 1:
                raise ConfigError(
                    f"ModelParallel's model axis {axis!r} spans processes ({', '.join(row)}): "
                    "tfdist splits weights over one process's devices only. Build the mesh "
                    "with the batch axis first, from keras.distribution.list_devices().")
        backend.start_engine("shm")


def _rows(distribution, axis) -> list[list[str]]:
    """The mesh's devices along `axis`, one list per copy (per index of the other axes)."""
    mesh = distribution.device_mesh
    devices = np.asarray(mesh.devices)
    k = list(mesh.axis_names).index(axis)
    return [[str(d) for d in row]
            for row in np.moveaxis(devices, k, -1).reshape(-1, devices.shape[k])]


def _task_of(device: str) -> int:
    """The task index in a `/job:worker/replica:0/task:T/...` name (0 for a local name)."""
    for part in device.split("/"):
        if part.startswith("task:"):
            return int(part[5:])
    return 0


def axis_devices(distribution, axis: str) -> list[str]:
    """This process's devices along mesh axis `axis`, as TensorFlow names them here."""
    rows = _rows(distribution, axis)
    mine = [r for r in rows if _task_of(r[0]) == backend.process_id()] or rows
    return [local_name(d) for d in mine[0]]


def local_name(device: str) -> str:
    """A device as TensorFlow names it in this process: Keras's 'cpu:1' is '/device:CPU:1',
    and '/job:worker/replica:0/task:1/device:CPU:0' is '/device:CPU:0'."""
    if "/device:" in device:
        return "/device:" + device.split("/device:")[-1]
    kind, _, index = device.partition(":")
    return f"/device:{kind.upper()}:{index or 0}"


def _data_parallel_strategy(distribution):
    """(strategy, what it is) for a distribution that keeps every weight whole."""
    devices = [str(d) for d in np.asarray(distribution.device_mesh.devices).flatten()]
    if backend.num_processes() > 1:
        expected = backend.list_devices()
        if sorted(devices) != sorted(expected) or len(expected) != backend.num_processes():
            raise ConfigError(
                f"A DataParallel mesh over {devices} in a job of {backend.num_processes()} "
                f"processes: tfdist's multi_worker engine trains on one device of every "
                f"process, {[d for d in expected if d.endswith(':0')]}. Build the mesh from "
                "keras.distribution.list_devices(), without TFDIST_DEVICES.")
        dist = backend.start_engine("multi_worker")
        return dist.strategy, "multi_worker (MultiWorkerMirroredStrategy)"
    from tfdist.strategies import mirrored

    return (mirrored.build_on([local_name(d) for d in devices]),
            f"mirrored over {', '.join(devices)}")


def current():
    """The distribution set now, as tfdist sees it (None: none)."""
    return _ACTIVE["distribution"]


def strategy():
    """The tf.distribute strategy of the distribution set now (None for a split model)."""
    return _ACTIVE["strategy"]


def distribute_dataset(distribution, dataset, keras_part):
    """What TensorFlow is given for a global-batch `dataset` when several processes train.

    Keras's `distribute_dataset` gives each process its rows of each global
    batch (`keras_part`: rebatched to the process's share, then every P-th
    part), a dataset TensorFlow cannot count, and Keras 3.15 on TensorFlow
    then ends each epoch with one extra step on an empty batch (Adam moves on
    zero gradients: measured, 9 steps on 8 batches). So the same rows are cut
    with the number of steps kept: under multi_worker TensorFlow cuts them
    itself (sharded by data, `AutoShardPolicy.DATA`); for ModelParallel
    copies across processes each process slices its rows out of every
    global batch. A dataset the user sharded already (`auto_shard_dataset=False`)
    is handed on as this process's part.
    """
    processes = backend.num_processes()
    if (processes == 1 or distribution is not _ACTIVE["distribution"]
            or not distribution.auto_shard_dataset):
        if _ACTIVE["strategy"] is not None and processes > 1:
            # multi_worker has one replica per process: this process's rows are its replica's.
            return _ACTIVE["strategy"].distribute_datasets_from_function(lambda ctx: keras_part)
        return keras_part
    import tensorflow as tf

    if _ACTIVE["strategy"] is not None:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.DATA)
        return _ACTIVE["strategy"].experimental_distribute_dataset(dataset.with_options(options))
    return dataset.map(rows_of_process(backend.process_id(), processes))


def rows_of_process(index: int, count: int):
    """A `Dataset.map` function: process `index`'s contiguous share of each batch's rows."""
    import tensorflow as tf

    def cut(*batch):
        rows = tf.shape(tf.nest.flatten(batch)[0])[0]
        start, stop = index * rows // count, (index + 1) * rows // count
        part = tf.nest.map_structure(lambda t: t[start:stop], batch)
        return part if len(batch) > 1 else part[0]

    return cut
