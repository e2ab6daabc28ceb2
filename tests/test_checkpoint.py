"""Chief-only writer, atomic writes and the backup format (no cluster needed)."""

import json
import os
import weakref
import zipfile

import ml_dtypes
import numpy as np
import pytest

from tfdist.checkpoint import BackupStore, TrainState, rebatch, signature
from tfdist.writer import ChiefWriter, atomic_path
from tfdist.errors import CheckpointError, PeerLostError
from tfdist.run.trainer import describe_peer_failure, locate_peer
from tfdist.cluster import detect


class Var:
    """Stands in for a Keras variable: value, path, shape, dtype."""

    def __init__(self, path, value):
        self.path, self.value = path, np.asarray(value, dtype="float32")
        self.shape, self.dtype = self.value.shape, self.value.dtype

    def numpy(self):
        return self.value

    def assign(self, value):
        assert value.shape == self.value.shape
        self.value = np.array(value)


def _vars(scale=1.0, shape=(2, 3)):
    return ([Var("dense/kernel", np.full(shape, scale)), Var("dense/bias", [scale] * shape[1])],
            [Var("sgd/iteration", 7.0 * scale)])


META = {"recipe": "digits_mlp", "strategy": "multi_worker", "num_replicas": 2,
        "global_batch_size": 64, "accumulate": 1}


def _expected(model, opt, **over):
    return {**META, "model_signature": signature(model),
            "optimizer_signature": signature(opt), **over}


def test_atomic_path_leaves_nothing_on_error(tmp_path):
    target = tmp_path / "f.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(str(target)) as tmp:
            open(tmp, "w").write("half")
            raise RuntimeError("crash mid-write")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["f.txt"]


def test_non_chief_writes_nothing(tmp_path):
    assert ChiefWriter(str(tmp_path), is_chief=False).write_json("m.json", {}) is None
    model, opt = _vars()
    assert BackupStore(ChiefWriter(str(tmp_path), False)).save(TrainState(), model, opt, META) is None
    assert os.listdir(tmp_path) == []
    path = ChiefWriter(str(tmp_path), is_chief=True).write_json("m.json", {"a": 1})
    assert json.load(open(path)) == {"a": 1} and os.stat(path).st_mode & 0o044


class _Model:
    """Stands in for a Keras model: `save` writes one file (Keras wants the .keras name)."""

    def save(self, path):
        assert path.endswith(".keras")
        open(path, "w").write("weights")


def _every_write(writer, store):
    """Every kind of write a run makes, through `writer` (and the store that takes it)."""
    model, opt = _vars()
    with writer.claim(lambda m: None):
        return [writer.write_json("metrics.json", {"a": 1}),
                writer.write_text("history.csv", "epoch,loss\n0,1.0\n"),
                writer.save_model(_Model()),
                writer.log_dir("logs"),
                store.save(TrainState(global_step=3), model, opt, META),
                store.save(TrainState(global_step=4), model, opt, META),
                writer.move_aside("history.csv", ".old")]


def test_writer_on_a_worker_writes_creates_and_removes_nothing(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    writer = ChiefWriter(str(tmp_path / "m"), is_chief=False)
    assert _every_write(writer, BackupStore(writer, keep=1)) == [None] * 7
    writer.remove(str(tmp_path / "keep.txt"))
    assert os.listdir(tmp_path) == ["keep.txt"]  # not even the model dir was created


def test_writer_on_the_chief_writes_everything_atomically(tmp_path):
    writer = ChiefWriter(str(tmp_path / "m"), is_chief=True)
    store = BackupStore(writer, keep=1)
    paths = _every_write(writer, store)
    assert paths[0] == str(tmp_path / "m" / "metrics.json")
    assert json.load(open(paths[0])) == {"a": 1}
    assert open(paths[2]).read() == "weights" and os.path.isdir(paths[3])
    assert store.paths() == [paths[5]]  # keep=1: the older backup was removed by the writer
    assert open(paths[6]).read().startswith("epoch,loss")
    assert sorted(os.listdir(tmp_path / "m")) == [
        ".tfdist.lock", "backup", "history.csv.old", "logs", "metrics.json", "model.keras"]
    assert os.listdir(tmp_path / "m" / "backup") == [os.path.basename(paths[5])]  # no temp left
    # A write that fails half-way leaves the previous file, and no temporary, behind.
    with pytest.raises(RuntimeError):
        writer.write_file("metrics.json", lambda tmp: (open(tmp, "w").write("{half"),
                                                       (_ for _ in ()).throw(RuntimeError())))
    assert json.load(open(paths[0])) == {"a": 1}
    assert sorted(os.listdir(tmp_path / "m"))[-2:] == ["metrics.json", "model.keras"]
    writer.remove("backup")
    assert not os.path.exists(store.directory)


def test_writer_with_a_relative_model_dir_writes_backups_inside_it(tmp_path, monkeypatch):
    # `tfdist.train RECIPE` with no --model-dir uses runs/RECIPE/MODE, relative to the cwd.
    monkeypatch.chdir(tmp_path)
    writer = ChiefWriter(os.path.join("runs", "r", "auto"), is_chief=True)
    store = BackupStore(writer, keep=2)
    model, opt = _vars(1.0)
    state = TrainState(epoch=1, step_in_epoch=0, global_step=4, history={"loss": [1.0]})
    store.save(state, model, opt, META)
    assert store.paths() == [os.path.join("runs", "r", "auto", "backup", "ckpt-0000000004.npz")]
    assert os.path.isfile(store.paths()[0])
    assert writer.path("metrics.json") == os.path.join("runs", "r", "auto", "metrics.json")
    writer.remove(store.directory)
    assert os.listdir(os.path.join("runs", "r", "auto")) == []  # nothing under runs/r/auto/runs


def test_save_load_restore_roundtrip_and_keep(tmp_path):
    store = BackupStore(ChiefWriter(str(tmp_path), True), keep=2)
    model, opt = _vars(1.0)
    for step in (5, 10, 15):
        state = TrainState(epoch=step // 10, step_in_epoch=step % 10, global_step=step,
                           history={"loss": [1.0]})
        model[0].value = np.full((2, 3), float(step))
        store.save(state, model, opt, META)
    assert [os.path.basename(p) for p in store.paths()] == [
        "ckpt-0000000010.npz", "ckpt-0000000015.npz"]
    record, arrays = store.load(store.latest())
    store.check_compatible(store.latest(), record, _expected(model, opt))
    assert record["state"] == {"epoch": 1, "step_in_epoch": 5, "global_step": 15,
                               "history": {"loss": [1.0]}, "data_offset": 0}
    fresh, fresh_opt = _vars(0.0)
    store.restore(arrays, fresh, fresh_opt)
    np.testing.assert_array_equal(fresh[0].value, np.full((2, 3), 15.0))
    assert float(fresh_opt[0].value) == 7.0


def _savez_backup(path, state, model, opt):
    """A backup as tfdist wrote it before saves were streamed: every array read, then np.savez."""
    from tfdist.checkpoint import BACKUP_FORMAT, _digest

    arrays = {f"model_{i}": np.asarray(v.numpy()) for i, v in enumerate(model)}
    arrays.update({f"opt_{i}": np.asarray(v.numpy()) for i, v in enumerate(opt)})
    record = {**META, "format": BACKUP_FORMAT, "state": {
        "epoch": state.epoch, "step_in_epoch": state.step_in_epoch,
        "global_step": state.global_step, "history": state.history,
        "data_offset": state.data_offset}, "model_signature": signature(model),
        "optimizer_signature": signature(opt), "sha256": _digest(arrays)}
    arrays["meta"] = np.frombuffer(json.dumps(record).encode(), dtype=np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def test_streamed_backup_holds_np_savez_entries_byte_for_byte(tmp_path):
    # Twelve variables, so "model_10" sorts before "model_2", of every dtype and
    # rank a model or optimizer holds (bfloat16, int64 counters, bools, scalars).
    values = [np.arange(6, dtype="float32").reshape(2, 3) * (k + 1) for k in range(12)]
    values += [np.array(3.5, dtype="float32"), np.array(True),
               np.linspace(0, 1, 5).astype(ml_dtypes.bfloat16),
               np.arange(12, dtype="float64").reshape(3, 4).T]  # not C-contiguous
    model = [Var(f"layer_{k}/kernel", 0.0) for k in range(len(values))]
    for var, value in zip(model, values):
        var.value, var.shape, var.dtype = value, value.shape, value.dtype
    opt = [Var("adam/iteration", 7.0)]
    opt[0].value = np.array(7, dtype="int64")
    state = TrainState(epoch=1, step_in_epoch=2, global_step=9, history={"loss": [0.5]})
    store = BackupStore(ChiefWriter(str(tmp_path), True))
    path = store.save(state, model, opt, META)
    _savez_backup(tmp_path / "old.npz", state, model, opt)
    with zipfile.ZipFile(path) as new, zipfile.ZipFile(tmp_path / "old.npz") as old:
        assert sorted(new.namelist()) == sorted(old.namelist())
        assert new.namelist()[-1] == "meta.npy"
        for name in old.namelist():
            assert new.read(name) == old.read(name), name
    record, arrays = store.load(path)  # the digest checks out
    for k, value in enumerate(values):  # bitwise (npy keeps bfloat16 as raw 2-byte |V2)
        assert arrays[f"model_{k}"].shape == value.shape
        assert arrays[f"model_{k}"].tobytes() == np.ascontiguousarray(value).tobytes()
    assert store.load(str(tmp_path / "old.npz"))[0] == record  # and the old file loads alike


def test_save_holds_one_array_at_a_time(tmp_path):
    alive, most = set(), [0]

    class Remote(Var):
        """A variable on another process: each read is a fresh array of its own."""

        def numpy(self):
            array = self.value.copy()
            alive.add(id(array))
            most[0] = max(most[0], len(alive))
            weakref.finalize(array, alive.discard, id(array))
            return array

    model = [Remote(f"dense_{k}/kernel", np.full((4, 4), k)) for k in range(6)]
    opt = [Remote(f"adam/m_{k}", np.full((4, 4), -k)) for k in range(6)]
    path = BackupStore(ChiefWriter(str(tmp_path), True)).save(TrainState(), model, opt, META)
    assert most[0] == 1
    _, arrays = BackupStore.load(path)
    np.testing.assert_array_equal(arrays["opt_5"], np.full((4, 4), -5.0))


def test_resume_of_a_single_file_backup_reads_one_array_at_a_time(tmp_path):
    """A single-file backup (one process, older tfdist) of a model larger than the chief
    still resumes: its digest is checked and its arrays assigned one at a time."""
    alive, most = set(), [0]

    class Held(Var):
        def assign(self, value):
            alive.add(id(value))
            most[0] = max(most[0], len(alive))
            weakref.finalize(value, alive.discard, id(value))
            super().assign(value)

    model = [Var(f"dense_{k}/kernel", np.full((4, 4), k)) for k in range(6)]
    opt = [Var(f"adam/m_{k}", np.full((4, 4), -k)) for k in range(6)]
    BackupStore(ChiefWriter(str(tmp_path), True)).save(TrainState(), model, opt, META)
    fresh = [Held(v.path, np.zeros((4, 4))) for v in model]
    fresh_opt = [Held(v.path, np.zeros((4, 4))) for v in opt]
    BackupStore(ChiefWriter(str(tmp_path), True)).resume(True, META, fresh, fresh_opt)
    assert most[0] == 1
    np.testing.assert_array_equal(fresh_opt[5].value, np.full((4, 4), -5.0))


def test_truncated_backup_is_a_clear_error(tmp_path):
    store = BackupStore(ChiefWriter(str(tmp_path), True))
    model, opt = _vars()
    path = store.save(TrainState(global_step=3), model, opt, META)
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=rf"Backup {path} is corrupt or truncated "
                                              r"\(BadZipFile.*--no-resume"):
        store.load(path)


def test_flipped_bytes_fail_the_checksum(tmp_path):
    store = BackupStore(ChiefWriter(str(tmp_path), True))
    model, opt = _vars()
    path = store.save(TrainState(global_step=3), model, opt, META)
    record, arrays = store.load(path)
    arrays = dict(arrays)  # a mapping read from the file on each access: copied to rewrite
    arrays["model_0"][0, 0] += 1  # rewrite one value, keeping the old digest
    arrays["meta"] = np.frombuffer(json.dumps(record).encode(), dtype=np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    with pytest.raises(CheckpointError, match="do not match the SHA-256"):
        store.load(path)


@pytest.mark.parametrize("over, message", [
    ({"recipe": "synthetic_cnn"},
     r"written with recipe='digits_mlp' but this run has recipe='synthetic_cnn'"),
    ({"accumulate": 2}, r"written with accumulate=1 but this run has accumulate=2"),
    ({"global_batch_size": 32}, r"global_batch_size=64 but this run has global_batch_size=32"),
])
def test_foreign_backup_is_refused(tmp_path, over, message):
    store = BackupStore(ChiefWriter(str(tmp_path), True))
    model, opt = _vars()
    path = store.save(TrainState(), model, opt, META)
    record, _ = store.load(path)
    with pytest.raises(CheckpointError, match=message):
        store.check_compatible(path, record, _expected(model, opt, **over))


def test_other_replica_count_and_strategy_resume(tmp_path):
    store = BackupStore(ChiefWriter(str(tmp_path), True))
    model, opt = _vars()
    store.save(TrainState(epoch=1, global_step=5), model, opt, META)
    fresh, fresh_opt = _vars(scale=0.0)
    state, _ = store.resume(True, {**META, "strategy": "horovod", "num_replicas": 3},
                            fresh, fresh_opt)
    assert state.global_step == 5 and fresh[0].value[0, 0] == 1.0
    assert (store.record["strategy"], store.record["num_replicas"]) == ("multi_worker", 2)


def test_model_shape_mismatch_is_refused(tmp_path):
    store = BackupStore(ChiefWriter(str(tmp_path), True))
    model, opt = _vars()
    path = store.save(TrainState(), model, opt, META)
    record, _ = store.load(path)
    bigger, bigger_opt = _vars(shape=(2, 4))
    with pytest.raises(CheckpointError, match=r"model variable 'dense/kernel' has shape \[2, 4\] "
                                              r"\(float32\) here but \[2, 3\] \(float32\)"):
        store.check_compatible(path, record, _expected(bigger, bigger_opt))


def test_describe_peer_failure_names_the_lost_worker_from_the_engines_fields():
    info = detect({"TF_CONFIG": '{"cluster": {"worker": ["127.0.0.1:5000", "127.0.0.1:5001", '
                                '"127.0.0.1:5002"]}, "task": {"type": "worker", "index": 0}}'})
    # The shm engine gives a rank; the address comes from the cluster spec.
    assert describe_peer_failure(PeerLostError("x", rank=2), info) == "worker 2 (127.0.0.1:5002)"
    assert locate_peer(PeerLostError("x", rank=2), info) == ("worker", 2, "127.0.0.1:5002")
    # An address the engine gives wins; an unknown job or rank has none.
    assert describe_peer_failure(PeerLostError("x", rank=1, address="127.0.0.9:7"),
                                 info) == "worker 1 (127.0.0.9:7)"
    assert describe_peer_failure(PeerLostError("x", rank=7), info) == "worker 7"
    assert describe_peer_failure(PeerLostError("x", rank=0, job="chief"), info) == "chief 0"
    # The message is never read: no rank, no peer (three workers: it could be either).
    assert describe_peer_failure(PeerLostError("rank 1 exited"), info) is None
    assert describe_peer_failure(None, info) is None


def test_describe_peer_failure_names_the_lost_host_next_to_its_address():
    info = detect({"TF_CONFIG": '{"cluster": {"worker": ["198.18.0.1:5000", "198.18.0.2:5001"]}, '
                                '"task": {"type": "worker", "index": 0}}'})
    names = {"198.18.0.2": "h1"}
    lost = PeerLostError("x", rank=1)
    assert describe_peer_failure(lost, info, names.get) == "worker 1 (198.18.0.2:5001, host h1)"
    assert describe_peer_failure(lost, info, lambda a: None) == "worker 1 (198.18.0.2:5001)"
    # A timed-out collective names no peer: with one peer, it is that one.
    assert describe_peer_failure(None, info, names.get) == "worker 1 (198.18.0.2:5001, host h1)"
    three = detect({"TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:1", "c:1"]}, '
                                 '"task": {"type": "worker", "index": 0}}'})
    assert describe_peer_failure(None, three, names.get) is None


def test_peer_lost_error_carries_the_peer_as_fields():
    e = PeerLostError("lost contact with worker 1", rank=1, address="127.0.0.1:5001")
    assert (e.job, e.rank, e.address, e.peer) == ("worker", 1, "127.0.0.1:5001",
                                                  "worker 1 (127.0.0.1:5001)")
    assert str(e) == "lost contact with worker 1" and PeerLostError("m").peer is None


def test_preemption_check_period():
    from tfdist.preemption import MULTI_PROCESS_CHECK_STEPS, default_check_steps

    assert default_check_steps(1) == 1
    assert default_check_steps(2) == default_check_steps(8) == MULTI_PROCESS_CHECK_STEPS == 20


def test_resume_restores_or_clears(tmp_path):
    store = BackupStore(ChiefWriter(str(tmp_path), True))
    model, opt = _vars(2.0)
    assert store.resume(True, META, model, opt) == (None, None)  # nothing to resume
    path = store.save(TrainState(epoch=1, global_step=22), model, opt, META)
    fresh, fresh_opt = _vars(0.0)
    state, got = store.resume(True, META, fresh, fresh_opt)
    assert got == path and state.global_step == 22 and float(fresh[1].value[0]) == 2.0
    # A non-chief never deletes; the chief does, and says what it removed.
    assert BackupStore(ChiefWriter(str(tmp_path), False)).resume(False, META, model, opt) == (
        None, path)
    assert os.path.exists(path)
    assert store.resume(False, META, model, opt) == (None, path)
    assert store.paths() == []


def test_resume_falls_back_past_a_corrupt_newest_backup(tmp_path):
    store = BackupStore(ChiefWriter(str(tmp_path), True))
    model, opt = _vars(2.0)
    good = store.save(TrainState(epoch=1, global_step=22), model, opt, META)
    bad = store.save(TrainState(epoch=2, global_step=44), *_vars(3.0), META)
    open(bad, "r+b").truncate(500)
    fresh, fresh_opt = _vars(0.0)
    # A non-chief falls back the same way and moves nothing.
    follower = BackupStore(ChiefWriter(str(tmp_path), False))
    assert follower.resume(True, META, *_vars(0.0))[1] == good and os.path.exists(bad)
    state, got = store.resume(True, META, fresh, fresh_opt)
    assert got == good and state.global_step == 22 and float(fresh[1].value[0]) == 2.0
    assert [p for p, _ in store.skipped] == [bad] and "corrupt or truncated" in store.skipped[0][1]
    assert not os.path.exists(bad) and os.path.exists(bad + ".corrupt")
    assert store.paths() == [good]


def test_all_backups_corrupt_is_an_error_and_nothing_is_moved(tmp_path):
    store = BackupStore(ChiefWriter(str(tmp_path), True))
    path = store.save(TrainState(epoch=1, global_step=22), *_vars(), META)
    open(path, "r+b").truncate(500)
    with pytest.raises(CheckpointError, match="is corrupt or truncated"):
        store.resume(True, META, *_vars())
    assert store.paths() == [path]


@pytest.mark.parametrize("written,step,now,ok", [
    (20, 15, 20, True),      # same layout, mid-epoch
    (20, 0, 10, True),       # another layout at an epoch end: exact
    (20, 15, 10, False),     # mid-epoch under another epoch length: refused
    (20, 15, 30, False),
    (None, 15, 10, False),   # an older backup whose step is past this epoch's end
    (None, 5, 10, True),
])
def test_layout_mapped_exactly_or_refused_naming_both(written, step, now, ok):
    from tfdist.checkpoint import check_layout

    record = {} if written is None else {"steps_per_epoch": written}
    state = TrainState(epoch=1, step_in_epoch=step, global_step=20 + step)
    if ok:
        check_layout("b.npz", record, state, now)
        return
    with pytest.raises(CheckpointError) as e:
        check_layout("b.npz", record, state, now)
    assert f"steps_per_epoch={written!r}" in str(e.value)
    assert f"this run has steps_per_epoch={now}" in str(e.value)


def test_batch_change_is_accepted_only_when_asked(tmp_path):
    store = BackupStore(ChiefWriter(str(tmp_path), True))
    model, opt = _vars()
    store.save(TrainState(epoch=1, step_in_epoch=6, global_step=28), model, opt, META)
    with pytest.raises(CheckpointError, match="global_batch_size=64 but this run has "
                                              "global_batch_size=96"):
        store.resume(True, {**META, "global_batch_size": 96}, *_vars(scale=0.0))
    fresh, fresh_opt = _vars(scale=0.0)
    # Its mid-epoch position at batch 64 is no position at 96: the caller maps it (rebatch).
    state, _ = store.resume(True, {**META, "global_batch_size": 96, "steps_per_epoch": 14},
                            fresh, fresh_opt, batch_change_ok=True)
    assert (state.step_in_epoch, fresh[0].value[0, 0]) == (6, 1.0)
    with pytest.raises(CheckpointError, match="accumulate=1 but this run has accumulate=2"):
        store.resume(True, {**META, "global_batch_size": 96, "accumulate": 2},
                     *_vars(scale=0.0), batch_change_ok=True)


@pytest.mark.parametrize("epoch, step, old, new, want_epoch, want_step, want_position, skipped", [
    # digits_mlp: 22 batches of 64 per pass, 14 of 96, 44 of 32.
    (1, 0, 64, 96, 1, 0, 14, 0),     # an epoch end maps exactly
    (1, 6, 64, 96, 1, 4, 18, 0),     # 384 examples done = 4 batches of 96
    (1, 8, 64, 96, 1, 6, 20, 64),    # 512 done: on at 576, skipping 64 (none twice)
    (1, 21, 64, 96, 2, 0, 28, 0),    # 1344 done: no batch of 96 left in the pass
    (1, 7, 64, 32, 1, 14, 58, 0),    # a smaller batch always maps exactly
])
def test_rebatch_keeps_the_data_position_in_examples(epoch, step, old, new, want_epoch,
                                                     want_step, want_position, skipped):
    per_pass = {64: 22, 96: 14, 32: 44}
    state = TrainState(epoch=epoch, step_in_epoch=step, global_step=epoch * 22 + step,
                       history={"loss": [1.0]})
    got, n = rebatch(state, old, new, per_pass[old], per_pass[new])
    assert (got.epoch, got.step_in_epoch, got.data_position, n) == (
        want_epoch, want_step, want_position, skipped)
    assert got.global_step == state.global_step  # optimizer steps keep counting
    assert got.history == state.history and got.history is not state.history
    # Mapped back, an exact position is where it was.
    if not skipped and want_epoch == epoch:
        back, _ = rebatch(got, new, old, per_pass[new], per_pass[old])
        assert (back.step_in_epoch, back.data_position) == (step, state.global_step)


def test_variables_are_matched_by_path_when_the_order_differs(tmp_path):
    store = BackupStore(ChiefWriter(str(tmp_path), True))
    model, opt = _vars(2.0)
    store.save(TrainState(global_step=3), model, opt, META)
    record, arrays = store.load(store.latest())
    fresh, fresh_opt = _vars(0.0)
    fresh.reverse()  # another layout lists the same variables in another order
    order = store.check_compatible(store.latest(), record, _expected(fresh, fresh_opt))
    assert order == {"model": [1, 0], "optimizer": [0]}
    store.restore(arrays, fresh, fresh_opt, order)
    np.testing.assert_array_equal(fresh[1].value, np.full((2, 3), 2.0))  # dense/kernel
    np.testing.assert_array_equal(fresh[0].value, [2.0] * 3)  # dense/bias


def test_a_transformer_backup_resumes_in_a_pipeline_and_back(tmp_path):
    # A split model lists its variables in stage order (the encoder, then the decoder),
    # which is not the model's: by position, dec_embed/embeddings met enc_1_ffn_norm/gamma.
    import keras

    from tfdist.model_parallel import pipeline

    def build():
        keras.utils.set_random_seed(0)
        enc_in, dec_in = keras.Input((4,), name="enc"), keras.Input((3,), name="dec")
        dec = keras.layers.Embedding(9, 8, name="dec_embed")(dec_in)
        enc = keras.layers.Embedding(7, 8, name="enc_embed")(enc_in)
        enc = keras.layers.LayerNormalization(name="enc_norm")(
            keras.layers.MultiHeadAttention(2, 4, name="enc_attn")(enc, enc))
        enc = keras.layers.Dense(8, name="enc_ffn")(enc)
        h = keras.layers.MultiHeadAttention(2, 4, name="cross_attn")(dec, enc)
        out = keras.layers.Dense(9, name="logits")(keras.layers.Dense(8, name="dec_ffn")(h))
        model = keras.Model([enc_in, dec_in], out)
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        model.optimizer.build(model.trainable_variables)
        return model

    plain = build()
    split = pipeline.split(build(), ["/cpu:0", "/cpu:0"])
    split.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    split.optimizer.build(split.trainable_variables)
    assert [v.path for v in split.variables] != [v.path for v in plain.variables]
    assert sorted(v.path for v in split.variables) == sorted(v.path for v in plain.variables)
    for source, target in ((plain, split), (split, plain)):
        for k, v in enumerate(source.variables):
            v.assign(np.full(v.shape, k + 1, v.dtype))
        store = BackupStore(ChiefWriter(str(tmp_path / source.name / str(id(source))), True))
        store.save(TrainState(global_step=1), source.variables, source.optimizer.variables,
                   META)
        state, _ = store.resume(True, META, target.variables, target.optimizer.variables)
        assert state.global_step == 1
        want = {v.path: v.numpy() for v in source.variables}
        for v in target.variables:
            np.testing.assert_array_equal(v.numpy(), want[v.path])
        slot = lambda v: v.path.split("/", 1)[-1]  # noqa: E731  (adam/... is adam_1/... there)
        want = {slot(v): v.numpy() for v in source.optimizer.variables}
        for v in target.optimizer.variables:
            np.testing.assert_array_equal(v.numpy(), want[slot(v)])


def test_a_tensor_parallel_backup_resumes_unsplit_and_back_shards_joined_and_cut():
    # The backup records each shard's slice of its plain weight (tfdist.reshard).
    import tempfile

    import keras

    from tfdist.model_parallel import pipeline, surgery

    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((5, 8), name="x")
        h = keras.layers.MultiHeadAttention(2, 4, name="attn")(inputs, inputs)
        h = keras.layers.Dense(12, activation="relu", name="ffn_in")(h)
        model = keras.Model(inputs, keras.layers.Dense(8, name="ffn_out")(h))
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        return model

    def with_slots(model):
        model.optimizer.build(model.trainable_variables)
        return model

    def split():
        model = pipeline.split(build(), ["/cpu:0", "/cpu:0"], tensor_parallel=2)
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        return with_slots(model)

    rng = np.random.default_rng(0)
    first = split()
    for v in first.variables + first.optimizer.variables:
        v.assign(rng.normal(size=v.shape).astype(v.dtype))
    plain, again = with_slots(build()), split()
    with tempfile.TemporaryDirectory() as tmp:
        for k, (source, target) in enumerate(((first, plain), (plain, again))):
            store = BackupStore(ChiefWriter(os.path.join(tmp, str(k)), True))
            store.save(TrainState(global_step=1), source.variables, source.optimizer.variables,
                       META)
            state, _ = store.resume(True, META, target.variables, target.optimizer.variables)
            assert state.global_step == 1
    for got, want in zip(plain.get_weights(), surgery.gather_model(first.unsplit()).get_weights()):
        np.testing.assert_array_equal(got, want)
    assert len(first.variables) != len(plain.variables)
    for a, b in zip(first.variables + first.optimizer.variables,
                    again.variables + again.optimizer.variables):
        assert a.path.split("/", 1)[-1] == b.path.split("/", 1)[-1] or a.path == b.path
        np.testing.assert_array_equal(a.numpy(), b.numpy())
