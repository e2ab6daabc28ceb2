"""tfdist.backup_layouts: the storage form is chosen once from the run, read back from
the record, and a sharded optimizer's slot parts (2 simulated workers) resume by name
in one unsharded process."""

import os

import numpy as np
import pytest

from tfdist import backup_layouts
from tfdist.checkpoint import BackupStore, TrainState
from tfdist.errors import CheckpointError
from tfdist.writer import ChiefWriter
from tfdist.zero import backup as zero_backup
from tfdist.zero.optimizer import SLOT_MARK

META = {"recipe": "r", "global_batch_size": 8}


def test_the_layout_comes_from_the_run_and_back_from_the_record():
    assert type(backup_layouts.for_run(True, None, False, None)) is backup_layouts.Whole
    assert type(backup_layouts.for_run(True, (1, 4), False, None)) is \
        backup_layouts.SlotParts
    assert type(backup_layouts.for_run(True, None, True, None)) is \
        backup_layouts.TaskParts
    assert type(backup_layouts.for_run(True, None, False, object())) is \
        backup_layouts.RowParts
    for record, kind in (({}, backup_layouts.Whole), ({"slot_parts": 2}, backup_layouts.SlotParts),
                         ({"parts": [{}], "parts_dir": "x"}, backup_layouts.TaskParts),
                         ({"row_parts": 3}, backup_layouts.RowParts)):
        assert type(backup_layouts.of_record(record)) is kind


def _vars(rank):
    """Worker `rank` of 2: two weights; the step counter; each weight's slot whole on its
    owner (weight i owned by rank i), zero-size on the other."""
    import keras

    weights = [keras.Variable(np.full((2, 3), 1.0 + i, "float32"), name=f"w{i}")
               for i in range(2)]
    iterations = keras.Variable(np.int64(5), name="iterations")
    slots = []
    for i in range(2):
        shape = (2, 3) if i == rank else (0,)
        slot = keras.Variable(np.full(shape, 10.0 * (i + 1), "float32"),
                              name=f"w{i}_momentum" if i == rank else f"w{i}_momentum_none")
        setattr(slot, SLOT_MARK, True)
        slots.append(slot)
    return weights, [iterations, *slots]


def test_slot_parts_are_each_workers_and_resume_by_name_in_one_process(tmp_path):
    import keras

    for rank in (1, 0):  # the chief last
        weights, optimizer_vars = _vars(rank)
        store = BackupStore(ChiefWriter(str(tmp_path), is_chief=rank == 0), shard=(rank, 2))
        store.save(TrainState(global_step=4), weights, optimizer_vars, META)
    backup = os.path.join(tmp_path, "backup", "ckpt-0000000004.npz")
    for rank in (0, 1):
        with np.load(zero_backup.part_path(backup, rank, 2)) as part:
            assert part.files == [f"w{rank}_momentum.npy"[:-4]]
    record, _ = BackupStore.load(backup)
    assert record["slot_parts"] == 2 and len(record["optimizer_signature"]) == 1
    # One unsharded process: every slot whole, found by name in the part that holds it.
    weights = [keras.Variable(np.zeros((2, 3), "float32"), name=f"w{i}") for i in range(2)]
    optimizer_vars = [keras.Variable(np.int64(0), name="iterations")] + [
        keras.Variable(np.zeros((2, 3), "float32"), name=f"w{i}_momentum") for i in range(2)]
    state, _ = BackupStore(ChiefWriter(str(tmp_path), is_chief=True)).resume(
        True, META, weights, optimizer_vars)
    assert state.global_step == 4 and int(optimizer_vars[0].numpy()) == 5
    for i in range(2):
        np.testing.assert_array_equal(weights[i].numpy(), np.full((2, 3), 1.0 + i))
        np.testing.assert_array_equal(optimizer_vars[1 + i].numpy(),
                                      np.full((2, 3), 10.0 * (i + 1)))
    os.remove(zero_backup.part_path(backup, 1, 2))
    with pytest.raises(CheckpointError, match="optimizer state of 1 of its 2 workers"):
        BackupStore.load(backup)
