"""`--shard optimizer` (ZeRO-1) and `--shard gradients` (ZeRO-2): N workers, each
holding 1/N of the optimizer state (and at "gradients" of the reduced gradients and
accumulators), end with one replica's weights.

One launched job per (strategy, N, level) trains the dense and the Embedding
(attention) model with SGD + momentum, Adam, AdamW and RMSprop in sequence
(tests/workers/equality_matrix.py through `tfdist.setup(shard=...)`), one 2-worker
job also lamb and adafactor (whole-weight optimizers: owners hold whole variables),
plus Adam on the Embedding model with 2 accumulated half batches and SGD on it
with every step clipped by global norm (each gradient is summed onto its owner only,
`tfdist.zero.scatter`, so the norm adds every worker's part); the one-replica
reference is test_equality_matrix's (each tower of its models is trained as if
alone, so its dense and attention cells are these). Every cell must equal one
replica at rtol 1e-5 (multi_worker gathering the weights in row ranges of 100
elements), every worker must hold the same weights, and each worker's slots must be
its share: together exactly one replica's, none over the mean by more than the
largest weight (`tfdist.zero.partition.owners`). The backup test is at the end.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from tests.conftest import WORKERS, run_py, run_py_many, tail
from tests.integration.test_equality_matrix import (ATOL, JOBS as MATRIX_JOBS, RTOL,
                                                    _assert_equal_weights, _load,
                                                    single_reference)
from tfdist.checkpoint import BackupStore

pytestmark = pytest.mark.integration

WORKER = os.path.join(WORKERS, "equality_matrix.py")
OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop")
MODELS = "dense,attention"
VARIANTS = "attention:adam:acc2,attention:sgd:clip"
CLIPPED = "attention:sgd:clip"  # the reference trains it too
assert CLIPPED in MATRIX_JOBS["single"][1][-1], MATRIX_JOBS["single"]
# Slots per weight byte: SGD's momentum; Adam's and AdamW's two moments; RMSprop's
# velocity (no momentum: its default).
SLOTS_PER_WEIGHT = {"sgd": 1, "adam": 2, "adamw": 2, "rmsprop": 1}
# (strategy, workers, --shard levels): each engine at each level it offers, each level
# at 2 and 4 workers (Horovod's in test_zero_horovod). At "gradients" a worker also
# keeps only its accumulators; at "parameters" only its rows of every weight (a job of
# two levels trains them in turn: one start-up). multi_worker's 4 workers run
# "optimizer" only: its 4-way rows are shm's 4-worker job's and its own 2-worker job's
# (the slowest level of the slowest engine at 4 processes on 2 cores, 1-2 minutes).
LAUNCHED = {("shm", 2, "optimizer"), ("shm", 4, "gradients,parameters"),
            ("multi_worker", 2, "gradients,parameters"),
            ("multi_worker", 4, "optimizer")}
JOBS = {(strategy, n, level) for strategy, n, levels in LAUNCHED
        for level in levels.split(",")}
# Whole-weight optimizers, trained where a 2-worker job has them: every owner holds
# whole variables, so their updates are one replica's.
WHOLE_WEIGHT = {("multi_worker", 2, "gradients"): ("lamb", "adafactor")}
# The same job at "parameters", where a worker holds rows of every weight: refused.
REFUSED = {("multi_worker", 2, "parameters"): ("lamb", "adafactor")}


def _command(out, strategy, n, levels):
    level = levels.split(",")[0]
    optimizers = OPTIMIZERS + WHOLE_WEIGHT.get((strategy, n, level), ())
    args = [WORKER, strategy, out, "--models", MODELS, "--optimizers", ",".join(optimizers)]
    # multi_worker's all_gathers in pieces of 100 elements: rows of a weight in several
    # (in the 2-worker job: the 4-worker one's many more collectives would cost time).
    chunks = ["--gather-chunk-elements", "100"] if (strategy, n) == ("multi_worker", 2) else []
    shard = ["--shard-optimizer-state"] if levels == "optimizer" else ["--shard", levels]
    return ["-m", "tfdist.launch", "-n", str(n), "--timeout", "400", "--", "python", *args,
            "--variants", VARIANTS, *shard, *chunks]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shared_run):
    """{(strategy, N, level): {worker: cells}}, run 2 at a time, and ("single", 0, "none"):
    the reference (test_equality_matrix's one-replica job: trained already when that
    module ran)."""
    from concurrent.futures import ThreadPoolExecutor

    tmp = tmp_path_factory.mktemp("zero")
    # The most processes and levels first, so the last job to end is a short one.
    launched = sorted(LAUNCHED, key=lambda job: (-job[1] * len(job[2].split(",")), job))
    outs = {job: str(tmp / "-".join(map(str, job[:2]))) for job in launched}
    with ThreadPoolExecutor(1) as pool:
        reference = pool.submit(shared_run, single_reference)
        procs = run_py_many([_command(outs[job], *job) for job in launched], parallel=2,
                            timeout=500)
        found = {("single", 0, "none"): reference.result()}
    for job, proc in zip(launched, procs):
        assert proc.returncode == 0, (job, tail(proc))
    for strategy, n, levels in launched:
        for level in levels.split(","):
            out = outs[(strategy, n, levels)]
            found[(strategy, n, level)] = _load(out if "," not in levels else f"{out}-{level}")
    return found


@pytest.mark.parametrize("job", sorted(JOBS))
def test_sharded_workers_equal_one_replica(runs, job):
    reference = runs[("single", 0, "none")]["worker0"]
    workers = runs[job]
    assert len(workers) == job[1]
    cells = workers["worker0"]
    for model in MODELS.split(","):
        for optimizer in OPTIMIZERS + WHOLE_WEIGHT.get(job, ()):
            cell = f"{model}-{optimizer}"
            _assert_equal_weights(cells[cell], reference[cell], cell=f"{job} {cell}")
            for other in workers.values():  # every worker got the owners' values
                for key, value in cells[cell].items():
                    np.testing.assert_array_equal(other[cell][key], value, err_msg=cell)
    for optimizer in REFUSED.get(job, ()):  # one line, naming what was received
        for model in MODELS.split(","):
            text = cells[f"{model}-{optimizer}"]
            assert isinstance(text, str) and "Received" in text and "\n" not in text, text
    # Sparse gradients, 2 accumulated half batches: the same step as one full batch.
    _assert_equal_weights(cells["attention-adam-acc2"], reference["attention-adam"],
                          cell=f"{job} attention-adam-acc2")
    # Every step clipped by the global norm of the summed gradients (dense and sparse).
    _assert_equal_weights(cells["attention-sgd-clip"], reference["attention-sgd-clip"],
                          cell=f"{job} attention-sgd-clip")


@pytest.mark.parametrize("job", sorted(JOBS))
def test_each_worker_holds_its_share_of_the_state(runs, job):
    n, level = job[1], job[2]
    if level == "parameters":
        return _assert_each_holds_its_rows(runs[job], n)
    for optimizer in OPTIMIZERS:
        states = [json.loads(w[f"state:dense+attention-{optimizer}"]) for w in runs[job].values()]
        assert {s["level"] for s in states} == {level}, states
        total = SLOTS_PER_WEIGHT[optimizer] * states[0]["weight_bytes"]
        slots = [s["slot_bytes"] for s in states]
        assert sum(slots) == total, (optimizer, slots, total)
        bound = SLOTS_PER_WEIGHT[optimizer] * states[0]["largest"]
        assert max(slots) <= total / n + bound, (optimizer, slots)
        assert min(slots) > 0, slots
    # With 2 accumulated half batches: Adam's 2 moments, and at "gradients" the
    # accumulators (one weight's worth) split too; at "optimizer" they stay whole.
    states = [json.loads(w["state:attention-adam-acc2"]) for w in runs[job].values()]
    per_weight = 3 if level == "gradients" else 2
    slots = [s["slot_bytes"] for s in states]
    assert sum(slots) == per_weight * states[0]["weight_bytes"], (level, slots)


def _assert_each_holds_its_rows(workers, n):
    """At "parameters": each worker holds its rows of every weight (together exactly
    the whole, besides the zero rows padding each share to ceil(rows / n)), no worker
    more than 1.1x the mean, and its slots and accumulators are of its rows only."""
    for row, per_weight in [(f"dense+attention-{o}", SLOTS_PER_WEIGHT[o]) for o in OPTIMIZERS
                            ] + [("attention-adam-acc2", 3)]:
        states = [json.loads(w[f"state:{row}"]) for w in workers.values()]
        assert {s["level"] for s in states} == {"parameters"}, states
        held = [s["held_bytes"] for s in states]
        whole = states[0]["weight_bytes"]
        assert sum(held) - sum(s["padding_bytes"] for s in states) == whole, (row, states)
        assert max(held) <= 1.1 * sum(held) / n, (row, held)
        for s in states:
            assert s["slot_bytes"] == per_weight * s["held_bytes"], (row, s)


@pytest.mark.parametrize("job", sorted(JOBS))
def test_every_engine_sums_gradients_onto_their_owners(runs, job):
    # Uncompressed, every engine reduce-scatters at every level (tfdist.zero.scatter):
    # multi_worker at "optimizer" in place of the all-reduce, shm's in place of its
    # DistributedOptimizer's, and at "gradients" in the optimizer's own step.
    for worker in runs[job].values():
        for row in [f"dense+attention-{o}" for o in OPTIMIZERS] + ["attention-sgd-clip"]:
            state = json.loads(worker[f"state:{row}"])
            assert state["scattered"] is True, (job, row, state)


def test_the_reference_moved_every_weight(runs):
    cells = runs[("single", 0, "none")]["worker0"]
    for model in MODELS.split(","):
        start = cells[f"init:{model}"]
        for optimizer in OPTIMIZERS:
            moved = cells[f"{model}-{optimizer}"]
            still = min(float(np.abs(moved[k] - start[k]).max()) for k in start
                        if k != "mha/key/bias")
            assert still > 100 * ATOL, (model, optimizer, still)
    assert RTOL == 1e-5


# Backups: 4 shm workers at --shard parameters train 2 epochs of digits_mlp under Adam
# (14 steps each, backups every 4 steps and at epoch ends; each weight and slot written
# whole, gathered by the chief one variable at a time); copies of their model dir then
# run to 4 epochs in 1 unsharded process, on 2 workers at --shard optimizer (each
# keeping the slots it owns) and on 2 workers at --shard parameters (each keeping its
# rows), and must end with the weights of one uninterrupted single-replica run. The
# resumed runs' own last backups (part files at optimizer, whole at parameters) and
# model.keras files (loaded by Keras alone) hold those weights too.
DUMP = os.path.join(WORKERS, "train_dump.py")
BACKUP_RUN = ["digits_mlp", "--seed", "0", "--deterministic", "--global-batch-size", "96",
              "--optimizer", "adam", "--learning-rate", "0.01", "--verbose", "0",
              "--threads", "1", "--save-every-steps", "4"]


def _train(tmp, name, n, strategy, epochs, model_dir, level):
    args = [DUMP, str(tmp / f"dump-{name}"), *BACKUP_RUN, "--epochs", str(epochs),
            "--strategy", strategy, "--model-dir", model_dir,
            *(["--shard", level] if level != "none" else [])]
    if n == 1:
        return args
    return ["-m", "tfdist.launch", "-n", str(n), "--timeout", "300", "--", "python", *args]


def test_a_parameters_backup_resumes_on_other_worker_counts_levels_and_unsharded(tmp_path):
    from tests.weights import dump_dir_weights, keras_file_weights

    first = str(tmp_path / "first")
    procs = run_py_many([_train(tmp_path, "baseline", 1, "single", 4,
                                str(tmp_path / "baseline"), "none"),
                         _train(tmp_path, "first", 4, "shm", 2, first, "parameters")],
                        timeout=400)
    for proc in procs:
        assert proc.returncode == 0, tail(proc)
    # At --shard parameters each worker wrote its rows beside the chief's record, which
    # holds no split variable (no process gathered one).
    backups = sorted(os.listdir(os.path.join(first, "backup")))
    written = "ckpt-0000000028.npz"
    assert [n for n in backups if n.startswith(written)] == [
        written, *(f"{written}.rows-{r}-of-4" for r in range(4))], backups
    with np.load(os.path.join(first, "backup", written)) as npz:
        record = json.loads(npz["meta"].tobytes().decode())
        assert record["row_keys"] and not set(record["row_keys"]) & set(npz.files)
    resumed = {"one": (1, "single", "none"), "optimizer": (2, "shm", "optimizer"),
               "parameters": (2, "shm", "parameters")}
    for name in resumed:
        shutil.copytree(first, str(tmp_path / name))
    procs = run_py_many([_train(tmp_path, name, n, strategy, 4, str(tmp_path / name), level)
                         for name, (n, strategy, level) in resumed.items()], timeout=400)
    baseline = dump_dir_weights(str(tmp_path / "dump-baseline"))[0]
    for (name, (workers, _, _)), proc in zip(resumed.items(), procs):
        assert proc.returncode == 0, tail(proc)
        assert "resumed from a 4-replica shm backup" in proc.stdout, tail(proc)
        got = dump_dir_weights(str(tmp_path / f"dump-{name}"))
        assert len(got) == workers
        for weights in got:
            assert len(weights) == len(baseline) == 4
            for a, b in zip(weights, baseline):
                np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=name)
    # At --shard optimizer each worker wrote the slots it owns beside the chief's backup;
    # model.keras is whole and loads: its optimizer group keeps the shared scalars only
    # (no worker's share of the slots), so Keras skips it, saying so.
    newest = "ckpt-0000000056.npz"
    sharded = os.path.join(tmp_path, "optimizer")
    backups = set(os.listdir(os.path.join(sharded, "backup")))
    assert {newest, f"{newest}.slots-0-of-2", f"{newest}.slots-1-of-2"} <= backups, backups
    for rank in (0, 1):
        part = np.load(os.path.join(sharded, "backup", f"{newest}.slots-{rank}-of-2"))
        assert part.files and all("momentum" in k or "velocity" in k for k in part.files)
    _assert_loads_without_optimizer_state(os.path.join(sharded, "model.keras"))
    # At --shard parameters: the 2 workers' last backup is their rows, read whole as one
    # replica's (weights, Adam's moments of full shape); model.keras is the weights.
    split = os.path.join(tmp_path, "parameters")
    names = sorted(os.listdir(os.path.join(split, "backup")))
    assert {newest, f"{newest}.rows-0-of-2", f"{newest}.rows-1-of-2"} <= set(names), names
    record, arrays = BackupStore.load(os.path.join(split, "backup", newest))
    for i, want in enumerate(baseline):
        np.testing.assert_allclose(arrays[f"model_{i}"], want, rtol=RTOL, atol=ATOL)
    moments = [arrays[f"opt_{i}"] for i, sig in enumerate(record["optimizer_signature"])
               if "momentum" in sig[0] or "velocity" in sig[0]]
    assert sorted(m.shape for m in moments) == sorted(w.shape for w in baseline for _ in (0, 1))
    saved = keras_file_weights(os.path.join(split, "model.keras"))
    assert len(saved) == len(baseline)  # no optimizer group: the model alone
    for a, b in zip(saved, baseline):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


LOAD = """
import sys, warnings
import keras
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    model = keras.saving.load_model(sys.argv[1])
print("LOADED", len(model.get_weights()))
for w in caught:
    print("WARNING", str(w.message).replace(chr(10), " "))
"""


def _assert_loads_without_optimizer_state(path):
    import zipfile

    import h5py

    with zipfile.ZipFile(path) as z, z.open("model.weights.h5") as f, h5py.File(f, "r") as h5:
        shapes = []
        h5["optimizer"].visititems(lambda name, obj: shapes.append(obj.shape) if isinstance(
            obj, h5py.Dataset) else None)
    assert shapes and all(shape == () for shape in shapes), shapes  # iterations, rate
    proc = run_py(["-c", LOAD, path])
    assert proc.returncode == 0, tail(proc)
    assert "LOADED 4" in proc.stdout, tail(proc)
    assert "WARNING Skipping variable loading for optimizer" in proc.stdout, tail(proc)


def test_a_mixed_float16_skip_is_taken_by_every_sharded_worker(tmp_path):
    """mixed_float16, one step's gradient of one weight overflowing on one worker's
    rows (tests/workers/zero_loss_scale.py): under shm and multi_worker, 2 sharded
    workers skip that step together (the loss scale halved once, 2 of 3 steps applied
    on both) and end with the weights of the same 2 workers unsharded, bit for bit, at
    `--shard optimizer` and at `--shard gradients` (where the finite check reads the
    local gradients before the reduce-scatter, and the workers' agreement carries it).
    On multi_worker the workers' agreement on the finite check
    (`multi_worker._all_true`) is what carries it: with it taken out, worker 0
    (finite rows) applied the step and waited in the all-gather that worker 1
    skipped until the collective timed out, failing this test (tried). On shm every
    worker checks every all-reduced gradient, so the agreement is redundant there.
    Both also train it at `--shard parameters` (the recomputed backward pass cast as
    the forward pass was), skipping the same step, to the same bits, and `dist.save`
    the split model whole."""
    worker = os.path.join(WORKERS, "zero_loss_scale.py")
    strategies = ("shm", "multi_worker")
    commands = [["-m", "tfdist.launch", "-n", "2", "--timeout", "200", "--", "python", worker,
                 strategy, str(tmp_path / strategy)] for strategy in strategies]
    for strategy in strategies:
        os.makedirs(tmp_path / strategy)
    for strategy, proc in zip(strategies, run_py_many(commands, timeout=300)):
        assert proc.returncode == 0, (strategy, tail(proc))
        ranks = [dict(np.load(tmp_path / strategy / f"worker{r}.npz")) for r in (0, 1)]
        for rank in ranks:
            for run in ("whole", "sharded", "gradients"):
                assert float(rank[f"{run}_scale"]) == 2.0 ** 14, (strategy, run)
                assert int(rank[f"{run}_iterations"]) == 2, (strategy, run)
            for key in (k for k in rank if k.startswith("whole:")):
                for run in ("sharded", "gradients"):
                    np.testing.assert_array_equal(rank[f"{run}:{key[6:]}"], rank[key],
                                                  err_msg=f"{strategy} {run} {key}")
                    np.testing.assert_array_equal(rank[f"{run}:{key[6:]}"],
                                                  ranks[0][f"{run}:{key[6:]}"])
        # And at --shard parameters, each worker holding rows.
        for rank in ranks:
            assert float(rank["parameters_scale"]) == 2.0 ** 14
            assert int(rank["parameters_iterations"]) == 2
            for key in (k for k in rank if k.startswith("whole:")):
                np.testing.assert_array_equal(rank[f"parameters:{key[6:]}"], rank[key],
                                              err_msg=f"parameters {key}")
        # dist.save of the split model: whole weights, in Keras's file.
        from tests.weights import keras_file_weights

        saved = keras_file_weights(str(tmp_path / strategy / "parameters.keras"))
        want = [v for k, v in ranks[0].items() if k.startswith("parameters:")]
        assert len(saved) == len(want) == 3
        for a, b in zip(saved, want):
            np.testing.assert_array_equal(a, b)
        # Sharded: a's slots (kernel and bias) on worker 0, b's kernel on worker 1.
        for run in ("sharded", "gradients"):
            assert [int(r[f"{run}_slot_bytes"]) for r in ranks] == [72, 48], (strategy, run)
        assert all(int(r["whole_slot_bytes"]) == 0 for r in ranks)
