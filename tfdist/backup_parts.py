"""A backup's variables written and read where they live: one tensor bundle per task.

When a model's variables live in several processes (pipeline stages in their
own processes, each possibly split over tensor-parallel devices), the chief
does not read them. Each task's variables are written by a `SaveV2` op placed
on that task (TensorFlow's tensor-bundle format: `PREFIX.index` plus
`PREFIX.data-00000-of-00001`, a CRC32C per entry), into a parts directory
beside the backup's index (`ckpt-N.npz.parts-NONCE/worker-K`). The chief then
records each part's keys and file sizes in the backup's meta record and
renames the index into place last, so a backup whose index exists has every
part written. At resume each variable is read by a `RestoreV2` op placed on
its own device, which reads only its slice when another tensor-parallel
layout wrote it (`reads`). Only the ops' names and paths pass through the
chief, never a tensor.

Verified here (TF 2.21): a relative prefix given to a `SaveV2` placed on
another task lands in that task's working directory, so the bytes are written
there; `RestoreV2` reads a slice of a tensor stored whole.
"""

from __future__ import annotations

import os
import re

from tfdist.errors import RESUME_ADVICE, CheckpointError, StorageError
from tfdist.reshard import Assemble

PARTS = ".parts-"  # ckpt-N.npz.parts-NONCE: a backup's part directory


def task_of(device: str) -> str:
    """Pure function: the part a variable on `device` is written to ("worker-1"; "local"
    for a device that names no task)."""
    job = re.search(r"/job:([^/]+)", device or "")
    task = re.search(r"/task:(\d+)", device or "")
    if not job or not task or job.group(1) == "localhost":
        return "local"
    return f"{job.group(1)}-{task.group(1)}"


def writer_device(device: str) -> str:
    """Pure function: CPU:0 of the task holding `device` (where its part is written)."""
    job = re.search(r"/job:([^/]+)", device or "")
    task = re.search(r"/task:(\d+)", device or "")
    if not job or not task:
        return "/device:CPU:0"
    return f"/job:{job.group(1)}/replica:0/task:{task.group(1)}/device:CPU:0"


def group(devices: dict) -> dict:
    """Pure function: {part: [keys]} for {key: device}, keys in sorted order."""
    out: dict[str, list] = {}
    for key in sorted(devices):
        out.setdefault(task_of(devices[key]), []).append(key)
    return out


def slice_spec(shape, ranges: dict) -> str:
    """Pure function: `RestoreV2`'s shape-and-slice string reading `ranges`
    ({axis: (start, stop)}) of a stored tensor of `shape` ("" for all of it)."""
    if not ranges:
        return ""
    dims = [f"{ranges[a][0]},{ranges[a][1] - ranges[a][0]}" if a in ranges else "-"
            for a in range(len(shape))]
    return " ".join(str(d) for d in shape) + " " + ":".join(dims)


def reads(step, shapes: dict) -> tuple[list, int | None]:
    """Pure function: what to read for one variable of this run.

    Args:
        step: A backup index (this layout's own variable) or a `reshard.Assemble`.
        shapes: {backup index: stored shape} of the entries `step` names.

    Returns:
        ([(index, slice spec)], axis to join them on or None): only the part of
        each stored entry that the variable holds, so a tensor-parallel shard
        reads its own slice, never the whole weight.
    """
    if not isinstance(step, Assemble):
        return [(step, "")], None
    take = step.take_axis
    if step.join_axis is None:  # one whole stored weight
        (source,) = step.sources
        ranges = {} if take is None else {take: (step.start, step.stop)}
        return [(source, slice_spec(shapes[source], ranges))], None
    out, offset = [], 0
    for source in step.sources:
        shape = shapes[source]
        length = shape[step.join_axis]
        if take == step.join_axis:  # only the stored shards this slice overlaps
            lo, hi = max(step.start, offset), min(step.stop, offset + length)
            if lo < hi:
                out.append((source, slice_spec(shape, {take: (lo - offset, hi - offset)})))
        else:
            ranges = {} if take is None else {take: (step.start, step.stop)}
            out.append((source, slice_spec(shape, ranges)))
        offset += length
    return out, (step.join_axis if len(out) > 1 else None)


def check_files(directory: str, record: dict) -> None:
    """Raises CheckpointError when a part file of the backup is missing or not the size
    recorded when it was written (a truncated or replaced part)."""
    parts_dir = os.path.join(directory, record["parts_dir"])
    for part in record["parts"]:
        for name, size in part["files"].items():
            path = os.path.join(parts_dir, name)
            got = os.path.getsize(path) if os.path.exists(path) else None
            if got != size:
                found = "missing" if got is None else f"{got} bytes, not {size}"
                raise CheckpointError(
                    f"Backup part {path} is {found}: the backup is incomplete. Delete its "
                    "index to resume from an older backup, or pass --no-resume to start "
                    "fresh.")


def save(parts_dir: str, variables: dict) -> list[dict]:
    """Writes each task's variables on that task; returns the parts' records.

    Args:
        parts_dir: The backup's part directory (made here; shared by every task).
        variables: {key: Keras or tf variable}.

    Returns:
        [{"name", "keys", "files": {file: bytes}}], one per task, for the index.
    """
    import tensorflow as tf
    from tensorflow.python.eager import context

    devices = {k: _handle(v).device for k, v in variables.items()}
    groups = group(devices)
    try:
        os.makedirs(parts_dir, exist_ok=True)
        for name, keys in groups.items():
            with tf.device(writer_device(devices[keys[0]])):
                tf.raw_ops.SaveV2(prefix=os.path.join(parts_dir, name), tensor_names=keys,
                                  shape_and_slices=[""] * len(keys),
                                  tensors=[_handle(variables[k]).read_value() for k in keys])
        context.async_wait()  # remote ops may still run: every part is on disk after this
    except (OSError, tf.errors.OpError) as e:  # a disk full or read-only: no index is written
        why = e.message.splitlines()[0] if isinstance(e, tf.errors.OpError) else e
        raise StorageError(f"Backup parts could not be written to {parts_dir} "
                           f"({type(e).__name__}: {why}). {RESUME_ADVICE}") from None
    out = []
    for name, keys in groups.items():
        files = sorted(f for f in os.listdir(parts_dir)
                       if f == f"{name}.index" or f.startswith(f"{name}.data-"))
        out.append({"name": name, "keys": keys,
                    "files": {f: os.path.getsize(os.path.join(parts_dir, f)) for f in files}})
    return out


def restore(directory: str, record: dict, variables, order, prefix: str) -> None:
    """Assigns each variable from the backup's parts, read on the variable's own device.

    Args:
        directory: The backup directory.
        record: The backup's meta record (with "parts").
        variables: This run's variables (model or optimizer).
        order: For each, its backup index or `reshard.Assemble` (`check_compatible`).
        prefix: "model" or "opt" (the keys' prefix).
    """
    import tensorflow as tf
    from tensorflow.python.eager import context

    parts_dir = os.path.join(directory, record["parts_dir"])
    where = {k: os.path.join(parts_dir, p["name"]) for p in record["parts"] for k in p["keys"]}
    signature = record["model_signature" if prefix == "model" else "optimizer_signature"]
    try:
        for step, v in zip(order, variables):
            handle = _handle(v)
            sources = step.sources if isinstance(step, Assemble) else (step,)
            plan, axis = reads(step, {i: signature[i][1] for i in sources})
            with tf.device(handle.device):
                pieces = [tf.raw_ops.RestoreV2(
                    prefix=where[f"{prefix}_{i}"], tensor_names=[f"{prefix}_{i}"],
                    shape_and_slices=[spec], dtypes=[handle.dtype])[0] for i, spec in plan]
                value = pieces[0] if axis is None else tf.concat(pieces, axis=axis)
                v.assign(value)
        context.async_wait()  # a remote read's error surfaces here
    except tf.errors.OpError as e:  # a checksum or size the bundle itself refuses
        raise CheckpointError(
            f"Backup parts in {parts_dir} cannot be read ({type(e).__name__}: "
            f"{e.message.splitlines()[0]}). Delete the backup's index (the .npz of the same "
            "name) to resume from an older backup, or pass --no-resume to start fresh.") from None


class Arrays:
    """A parts backup's entries by key, each read (by this process) when asked for.

    For reading a backup outside a run (`tfdist.export`): one entry at a time
    passes through this process, from the part that holds it.
    """

    def __init__(self, directory: str, record: dict):
        parts_dir = os.path.join(directory, record["parts_dir"])
        self._where = {k: os.path.join(parts_dir, p["name"])
                       for p in record["parts"] for k in p["keys"]}
        self._readers: dict = {}

    def __getitem__(self, key):
        import tensorflow as tf

        prefix = self._where[key]
        if prefix not in self._readers:
            self._readers[prefix] = tf.train.load_checkpoint(prefix)
        return self._readers[prefix].get_tensor(key)


def _handle(variable):
    """The tf.Variable under a Keras variable (it carries the device)."""
    return getattr(variable, "value", variable) if hasattr(variable, "path") else variable
