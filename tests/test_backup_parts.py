"""Backups written where the variables live (`tfdist.backup_parts`): the pure parts,
and a placed backup saved and resumed in one process (no cluster needed; the
multi-process case is tests/integration/test_pipeline_processes.py)."""

import os

import numpy as np
import pytest

from tfdist import backup_parts
from tfdist.checkpoint import BackupStore, TrainState
from tfdist.errors import CheckpointError
from tfdist.reshard import Assemble
from tfdist.writer import ChiefWriter


@pytest.mark.parametrize("device, part, writer", [
    ("/job:worker/replica:0/task:1/device:CPU:1", "worker-1",
     "/job:worker/replica:0/task:1/device:CPU:0"),
    ("/job:localhost/replica:0/task:0/device:CPU:0", "local",
     "/job:localhost/replica:0/task:0/device:CPU:0"),
    ("", "local", "/device:CPU:0"),
])
def test_each_device_writes_to_its_tasks_part_from_that_tasks_cpu(device, part, writer):
    assert backup_parts.task_of(device) == part
    assert backup_parts.writer_device(device) == writer


def test_variables_are_grouped_by_task_in_key_order():
    w = "/job:worker/replica:0/task:{}/device:CPU:{}"
    got = backup_parts.group({"opt_0": w.format(0, 0), "model_1": w.format(1, 1),
                              "model_0": w.format(1, 0), "model_2": w.format(0, 0)})
    assert got == {"worker-0": ["model_2", "opt_0"], "worker-1": ["model_0", "model_1"]}


def test_slice_spec_names_the_full_shape_then_start_length_per_axis():
    assert backup_parts.slice_spec([4, 6], {}) == ""
    assert backup_parts.slice_spec([4, 6], {1: (2, 5)}) == "4 6 -:2,3"
    assert backup_parts.slice_spec([8], {0: (4, 8)}) == "8 4,4"


def test_a_shard_reads_only_its_slice_of_a_whole_stored_weight():
    step = Assemble(sources=(3,), join_axis=None, take_axis=1, start=3, stop=6)
    assert backup_parts.reads(step, {3: [4, 6]}) == ([(3, "4 6 -:3,3")], None)
    whole = Assemble(sources=(3,), join_axis=None, take_axis=None)
    assert backup_parts.reads(whole, {3: [4, 6]}) == ([(3, "")], None)
    assert backup_parts.reads(5, {}) == ([(5, "")], None)  # this layout's own variable


def test_a_shard_reads_only_the_stored_shards_it_overlaps():
    # Stored at T = 3 (columns 0-2, 2-4, 4-6 of a [4, 6] weight), wanted at T = 2.
    shapes = {0: [4, 2], 1: [4, 2], 2: [4, 2]}
    first = Assemble(sources=(0, 1, 2), join_axis=1, take_axis=1, start=0, stop=3)
    got, axis = backup_parts.reads(first, shapes)
    assert got == [(0, "4 2 -:0,2"), (1, "4 2 -:0,1")] and axis == 1
    second = Assemble(sources=(0, 1, 2), join_axis=1, take_axis=1, start=3, stop=6)
    got, axis = backup_parts.reads(second, shapes)
    assert got == [(1, "4 2 -:1,1"), (2, "4 2 -:0,2")] and axis == 1
    # Unsplit here: every shard, whole, joined.
    plain = Assemble(sources=(0, 1, 2), join_axis=1, take_axis=None)
    assert backup_parts.reads(plain, shapes) == ([(0, ""), (1, ""), (2, "")], 1)
    # Inside one stored shard: one read, nothing to join.
    inside = Assemble(sources=(0, 1, 2), join_axis=1, take_axis=1, start=2, stop=4)
    assert backup_parts.reads(inside, shapes) == ([(1, "4 2 -:0,2")], None)


def test_a_missing_or_resized_part_file_is_a_clear_error(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "worker-1.index").write_bytes(b"x" * 10)
    record = {"parts_dir": "p", "parts": [{"name": "worker-1", "keys": ["model_0"],
                                           "files": {"worker-1.index": 10,
                                                     "worker-1.data-00000-of-00001": 5}}]}
    with pytest.raises(CheckpointError, match=r"worker-1.data-00000-of-00001 is missing"):
        backup_parts.check_files(str(tmp_path), record)
    (tmp_path / "p" / "worker-1.data-00000-of-00001").write_bytes(b"x" * 4)
    with pytest.raises(CheckpointError, match="4 bytes, not 5"):
        backup_parts.check_files(str(tmp_path), record)


# --- a placed backup in one process (TensorFlow, no cluster) ---------------------------

META = {"recipe": "r", "global_batch_size": 8, "accumulate": 1}


def _model(units=6, tp=1, seed=0.0):
    """Keras variables of one Dense kernel [4, units], split in `tp` column shards that
    record their plain weight as tensor-parallel shards do, plus an Adam-like slot each."""
    import keras

    rows = np.arange(4 * units, dtype="float32").reshape(4, units) + seed
    with keras.name_scope("adam"):
        opt = [keras.Variable(np.float32(7 + seed), name="iteration")]
    model, width = [], units // tp
    for t in range(tp):
        cols = slice(t * width, (t + 1) * width)
        name = f"kernel_{t}" if tp > 1 else "kernel"
        with keras.name_scope("dense"):
            v = keras.Variable(rows[:, cols], name=name)
        if tp > 1:
            v._tfdist_plain = ["dense/kernel", 1, t * width, (t + 1) * width, [4, units]]
        model.append(v)
        with keras.name_scope("adam"):
            opt.append(keras.Variable(-rows[:, cols], name=f"dense_{name}_momentum"))
    return model, opt


def _store(tmp_path, placed=True):
    return BackupStore(ChiefWriter(str(tmp_path), is_chief=True), keep=2, placed=placed)


@pytest.mark.parametrize("wrote, reads", [(1, 1), (3, 2), (2, 1), (1, 2)])
def test_a_placed_backup_resumes_under_another_tensor_parallel_degree(tmp_path, wrote, reads):
    store = _store(tmp_path)
    model, opt = _model(tp=wrote)
    path = store.save(TrainState(global_step=5), model, opt, META)
    with np.load(path) as npz:
        assert npz.files == ["meta"]  # the index: the record alone, every array in a part
    (parts_dir,) = [f for f in os.listdir(store.directory) if backup_parts.PARTS in f]
    assert sorted(os.listdir(os.path.join(store.directory, parts_dir))) == [
        "local.data-00000-of-00001", "local.index"]

    fresh, fresh_opt = _model(tp=reads, seed=100.0)
    state, got = _store(tmp_path).resume(True, META, fresh, fresh_opt)
    assert got == path and state.global_step == 5
    want = np.arange(24, dtype="float32").reshape(4, 6)
    joined = np.concatenate([np.asarray(v) for v in fresh], axis=1)
    np.testing.assert_array_equal(joined, want)
    np.testing.assert_array_equal(
        np.concatenate([np.asarray(v) for v in fresh_opt[1:]], axis=1), -want)
    assert float(np.asarray(fresh_opt[0])) == 7.0


def test_a_save_killed_before_its_index_leaves_the_last_backup_whole(tmp_path):
    store = _store(tmp_path)
    model, opt = _model()
    first = store.save(TrainState(global_step=1), model, opt, META)
    # A second save killed after its parts, before its index: parts without an index.
    orphan = os.path.join(store.directory, "ckpt-0000000002.npz.parts-1-dead")
    backup_parts.save(orphan, {"model_0": model[0]})
    state, got = _store(tmp_path).resume(True, META, *_model(seed=9.0))
    assert got == first and state.global_step == 1
    store.save(TrainState(global_step=3), model, opt, META)
    assert not os.path.exists(orphan)  # removed by the next save
    store.save(TrainState(global_step=4), model, opt, META)
    store.save(TrainState(global_step=4), model, opt, META)  # the same step again
    names = sorted(os.listdir(store.directory))
    assert [n for n in names if n.endswith(".npz")] == ["ckpt-0000000003.npz",
                                                          "ckpt-0000000004.npz"]
    assert len([n for n in names if backup_parts.PARTS in n]) == 2  # pruned with their index


def test_a_truncated_part_falls_back_to_the_previous_backup(tmp_path):
    store = _store(tmp_path)
    model, opt = _model()
    first = store.save(TrainState(global_step=1), model, opt, META)
    second = store.save(TrainState(global_step=2), model, opt, META)
    parts = [f for f in os.listdir(store.directory)
             if f.startswith(os.path.basename(second) + backup_parts.PARTS)]
    data = os.path.join(store.directory, parts[0], "local.data-00000-of-00001")
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) - 4)
    resumer = _store(tmp_path)
    state, got = resumer.resume(True, META, *_model(seed=9.0))
    assert got == first and state.global_step == 1
    assert "bytes, not" in resumer.skipped[0][1]


def test_an_unplaced_store_still_writes_and_resumes_one_file(tmp_path):
    model, opt = _model()
    path = _store(tmp_path, placed=False).save(TrainState(global_step=1), model, opt, META)
    assert not [f for f in os.listdir(os.path.dirname(path)) if backup_parts.PARTS in f]
    fresh, fresh_opt = _model(seed=3.0)
    _store(tmp_path).resume(True, META, fresh, fresh_opt)  # a placed run reads it too
    np.testing.assert_array_equal(np.asarray(fresh[0]), np.asarray(model[0]))


def test_flipped_bytes_in_a_part_are_a_clear_error(tmp_path):
    store = _store(tmp_path)
    model, opt = _model()
    path = store.save(TrainState(global_step=1), model, opt, META)
    (parts,) = [f for f in os.listdir(store.directory) if backup_parts.PARTS in f]
    data = os.path.join(store.directory, parts, "local.data-00000-of-00001")
    with open(data, "r+b") as f:  # same size: only the bundle's CRC32C can tell
        f.seek(8)
        byte = f.read(1)
        f.seek(8)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CheckpointError, match=r"cannot be read .*[Cc]hecksum.*older backup"):
        _store(tmp_path).resume(True, META, *_model(seed=9.0))
    assert os.path.exists(path)


def test_capped_takes_a_limit_in_mib_a_report_and_the_command():
    from tfdist.bench import capped

    assert capped.parse(["1900", "--", "python", "-c", "1"]) == (
        1900 * 2 ** 20, None, ["python", "-c", "1"])
    assert capped.parse(["1.5", "--report", "r.json", "--", "x"]) == (
        int(1.5 * 2 ** 20), "r.json", ["x"])
    with pytest.raises(SystemExit, match="Received"):
        capped.parse(["1900", "python"])


def test_the_record_is_read_without_the_arrays(tmp_path):
    """Every process of a run reads the newest backup's record before TensorFlow
    (`run_dir.inspect`): a single-file backup larger than a process must not be loaded
    whole for it (a 4-stage run's resume was killed by its memory cap that way)."""
    model, opt = _model()
    path = _store(tmp_path, placed=False).save(TrainState(global_step=3), model, opt, META)
    with open(path, "r+b") as f:  # corrupt the first array's bytes
        f.seek(200)
        f.write(b"\xff" * 16)
    with pytest.raises(CheckpointError, match="corrupt"):
        BackupStore.load(path)
    assert BackupStore.read_record(path)["state"]["global_step"] == 3


def test_parts_that_cannot_be_written_are_one_storage_error_and_no_index(tmp_path):
    from tfdist.errors import StorageError

    store = _store(tmp_path)
    model, opt = _model()
    first = store.save(TrainState(global_step=1), model, opt, META)
    parts = tmp_path / "parts"
    (parts / "local.index").mkdir(parents=True)  # where the bundle's index would go
    with pytest.raises(StorageError, match="could not be written .* previous backup"):
        backup_parts.save(str(parts), {"model_0": model[0]})
    assert store.paths() == [first]
