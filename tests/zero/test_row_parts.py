"""Backups at --shard parameters: each worker writes its rows, read back on any layout
(tfdist.zero.row_parts through BackupStore). Workers are simulated in one process: one
split model per rank, one process's host collectives (`Local`: they return at once)."""

import os
import zipfile

import numpy as np
import pytest

from tfdist.checkpoint import BackupStore, TrainState
from tfdist.collectives import Local
from tfdist.errors import CheckpointError
from tfdist.writer import ChiefWriter
from tfdist.zero import parameters
from tfdist.zero.backup import ROWS, existing_parts, part_path, part_paths

META = {"recipe": "r", "global_batch_size": 8}
STEP = 6


class _NoEngine:
    pass


def _model(seed=4):
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((3,), dtype="int32")
    x = keras.layers.Embedding(7, 5, name="embed")(inputs)
    x = keras.layers.Flatten()(x)
    return keras.Model(inputs, keras.layers.Dense(3, name="out")(x))


def _split(rank, n):
    model = _model()
    parameters.shard_model(model, _NoEngine(), rank=rank, n=n, collectives=Local(),
                           broadcast=False)
    return model


def _store(path, rank):
    return BackupStore(ChiefWriter(str(path), is_chief=rank == 0))


def _save(tmp_path, n=3, step=STEP):
    """n simulated workers at parameters save `step`; the chief last (as the barrier
    orders it). Returns the whole weights."""
    want = [v.numpy() for v in _model().weights]
    for rank in reversed(range(n)):
        model = _split(rank, n)
        got = _store(tmp_path, rank).save(TrainState(global_step=step), model.weights, [],
                                          META)
        assert (got is not None) == (rank == 0)
    return want


def test_each_worker_writes_its_rows_and_the_chief_no_split_weight(tmp_path):
    want = _save(tmp_path)
    backup = os.path.join(tmp_path, "backup", f"ckpt-{STEP:010d}.npz")
    names = sorted(os.listdir(os.path.dirname(backup)))
    assert names == [os.path.basename(p) for p in [backup, *part_paths(backup, 3, ROWS)]]
    with zipfile.ZipFile(backup) as z:
        assert z.namelist() == ["meta.npy"]  # every weight is split: the record alone
    # Embedding 7 rows over 3: 3 + 3 + 1; Dense kernel 15 rows: 5 each; bias 3: 1 each.
    record, arrays = BackupStore.load(backup)
    assert record["row_parts"] == 3 and record["row_keys"] == ["model_0", "model_1",
                                                                "model_2"]
    for i, w in enumerate(want):
        np.testing.assert_array_equal(arrays[f"model_{i}"], w)
    with np.load(part_path(backup, 2, 3, ROWS)) as part:
        assert part["model_0"].shape == (1, 5)  # no padding written


@pytest.mark.parametrize("n", [1, 2, 4])
def test_a_rows_backup_resumes_on_any_worker_count_reading_only_its_rows(tmp_path, n):
    want = _save(tmp_path)
    if n == 1:  # one process, unsharded: the whole values
        model = _model(seed=9)
        state, _ = _store(tmp_path, 0).resume(True, META, model.weights, [])
        for v, w in zip(model.weights, want):
            np.testing.assert_array_equal(v.numpy(), w)
        assert state.global_step == STEP
        return
    for rank in range(n):
        model = _split(rank, n)
        for v in model.weights:
            v.assign(np.full(v.shape, 7.0, "float32"))
        _store(tmp_path, rank).resume(True, META, model.weights, [])
        for v, w in zip(model.weights, want):
            start, stop, _, _ = parameters.rows_of(v)
            np.testing.assert_array_equal(v.numpy()[:stop - start], w[start:stop])
            assert not v.numpy()[stop - start:].any()  # padding stays zero


def test_a_missing_or_damaged_row_part_falls_back_to_the_previous_backup(tmp_path):
    _save(tmp_path)  # step 6
    older = os.path.join(tmp_path, "backup", f"ckpt-{STEP:010d}.npz")
    _save(tmp_path, step=9)
    newest = os.path.join(tmp_path, "backup", "ckpt-0000000009.npz")
    part = part_path(newest, 1, 3, ROWS)
    with open(part, "r+b") as f:  # flip a byte inside an array
        f.seek(120)
        byte = f.read(1)
        f.seek(120)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CheckpointError, match="rows-1-of-3"):
        BackupStore.load(newest)
    state, path = _store(tmp_path, 0).resume(True, META, _model(9).weights, [])
    assert path == older and state.global_step == STEP
    os.remove(part_path(older, 0, 3, ROWS))
    with pytest.raises(CheckpointError, match="rows of a worker are missing"):
        BackupStore.load(older)


def test_row_parts_of_a_save_that_never_got_its_record_are_removed(tmp_path):
    _save(tmp_path)
    directory = os.path.join(tmp_path, "backup")
    orphan = part_path(os.path.join(directory, "ckpt-0000000099.npz"), 0, 3, ROWS)
    open(orphan, "wb").close()
    model = _split(0, 3)
    _store(tmp_path, 0).save(TrainState(global_step=12), model.weights, [], META)
    assert not os.path.exists(orphan)
    assert existing_parts(os.path.join(directory, f"ckpt-{STEP:010d}.npz"), ROWS)


def test_a_part_names_its_backup_and_nothing_else_is_a_part():
    from tfdist.zero.backup import SLOTS, backup_of

    assert backup_of("ckpt-0000000006.npz.rows-2-of-3", ROWS) == "ckpt-0000000006.npz"
    assert backup_of("ckpt-0000000006.npz.rows-2-of-3.tmp41", ROWS) is None  # mid-write
    assert backup_of("ckpt-0000000006.npz.slots-0-of-2", ROWS) is None
    assert backup_of("ckpt-0000000006.npz.slots-0-of-2", SLOTS) == "ckpt-0000000006.npz"
    assert backup_of("ckpt-0000000006.npz", ROWS) is None
