"""Real processes: mirrored and multi-worker training equal single-replica training.

Every run trains digits_mlp for 2 epochs of plain SGD at global batch 64 with
deterministic ops and the same seed; only the strategy differs. The weights,
predictions and evaluation must agree with the single-replica run.
tests/integration/test_equality_matrix.py trains every strategy with every
optimizer, accumulation included, through `tfdist.setup()`; a run here is the
trainer's path (`python -m tfdist.train`), and where a strategy has several
runs, one of them carries the checks of the job as a whole (evaluation, files,
logs) rather than a plain run of its own.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.conftest import WORKERS, override, run_py, run_py_many, tail
from tests.weights import dump_weights as _weights

pytestmark = pytest.mark.integration

COMMON = ["digits_mlp", "--epochs", "2", "--seed", "0", "--deterministic",
          "--global-batch-size", "64", "--learning-rate", "0.1", "--verbose", "0",
          "--threads", "1"]
RTOL, ATOL = 1e-5, 1e-6
# Small clip threshold: digits gradients are clipped at almost every step.
LAMB_CLIP = ["--optimizer", "lamb", "--learning-rate", "0.01", "--clipnorm", "0.5"]
CHIEF_FILES = [".tfdist.lock", "backup", "history.csv", "metrics.json", "model.keras"]


def _train(tmp, name, extra, launch_n=0):
    return _collect(tmp, name, run_py(_command(tmp, name, extra, launch_n)))


def _command(tmp, name, extra, launch_n=0):
    dump = os.path.join(tmp, name, "dump")
    model_dir = os.path.join(tmp, name, "model")
    worker = [os.path.join(WORKERS, "train_dump.py"), dump,
              *override(COMMON, "--model-dir", model_dir, *extra)]
    return (["-m", "tfdist.launch", "-n", str(launch_n), "--timeout", "200", "--", "python",
             *worker] if launch_n else worker)


def _collect(tmp, name, proc):
    assert proc.returncode == 0, (name, tail(proc))
    dump = os.path.join(tmp, name, "dump")
    dumps = [dict(np.load(os.path.join(dump, f))) for f in sorted(os.listdir(dump))]
    return dumps, os.path.join(tmp, name, "model"), proc


# Runs other modules compare with too (tests/integration/conftest.py: trained once).
def single_run(tmp):
    """One replica, plain SGD: test_first_hour's and the Slurm tests' reference too (the
    defaults of test_first_hour's command line; slurm_util.ARGS)."""
    return _train(tmp, "single", ["--strategy", "single"])


def multi_worker_run(tmp):
    """2 MWMS workers, plain SGD: test_grad_compression's uncompressed run too."""
    return _train(tmp, "mw", ["--strategy", "multi_worker"], launch_n=2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shared_run):
    tmp = str(tmp_path_factory.mktemp("dp"))
    return {
        "single": shared_run(single_run),
        # mirrored's plain SGD run of this command line: test_slurm_jobs'
        # test_mirrored_job_on_one_node (equal to this single run); the checks of
        # mirrored's own run are made on mirrored_lamb_clip.
        "multi_worker": shared_run(multi_worker_run),
        **_train_many(tmp, RUNS),
    }


# Techniques and precisions, each against a reference run here (name: extra, tasks launched).
RUNS = {
    # 2 micro-batches of 32 accumulated = one batch of 64 (mirrored's
    # accumulation: test_equality_matrix's sparse acc2 cells).
    "multi_worker_accum": (["--strategy", "multi_worker", "--global-batch-size", "32",
                            "--accumulate", "2"], 2),
    # shm's plain SGD cells: test_equality_matrix; its run-level checks are made here.
    "shm_accum_lamb_clip": (["--strategy", "shm", *LAMB_CLIP, "--global-batch-size", "32",
                             "--accumulate", "2"], 2),
    "single_lamb_clip": (["--strategy", "single", *LAMB_CLIP], 0),
    "mirrored_lamb_clip": (["--strategy", "mirrored", "--devices", "2", *LAMB_CLIP], 0),
    "mirrored_fp16": (["--strategy", "mirrored", "--devices", "2",
                       "--precision", "mixed_float16"], 0),
    "shm_fp16": (["--strategy", "shm", "--precision", "mixed_float16"], 2),
    # float16's reference for 2 replicas: one replica taking each batch in 2 halves.
    "single_fp16": (["--strategy", "single", "--precision", "mixed_float16"], 0),
    "single_fp16_halves": (["--strategy", "single", "--precision", "mixed_float16",
                            "--global-batch-size", "32", "--accumulate", "2"], 0),
}


def _train_many(tmp, runs):
    """`_train` for each run, two at a time (each task is one thread; timing changes no result)."""
    procs = run_py_many([_command(tmp, name, extra, n) for name, (extra, n) in runs.items()],
                        timeout=240)
    return {name: _collect(tmp, name, proc) for name, proc in zip(runs, procs)}


def _assert_same_weights(a, b):
    wa, wb = _weights(a), _weights(b)
    assert len(wa) == len(wb) == 4
    for x, y in zip(wa, wb):
        np.testing.assert_allclose(x, y, rtol=RTOL, atol=ATOL)


def test_mirrored_two_devices_equals_single(runs):
    (single,), _, _ = runs["single_lamb_clip"]
    (mirrored,), _, _ = runs["mirrored_lamb_clip"]
    assert int(single["num_replicas"]) == 1 and int(mirrored["num_replicas"]) == 2
    _assert_same_weights(mirrored, single)


def test_multi_worker_equals_single_and_workers_agree(runs):
    (single,), _, _ = runs["single"]
    workers, _, _ = runs["multi_worker"]
    assert len(workers) == 2 and all(int(w["num_replicas"]) == 2 for w in workers)
    _assert_same_weights(workers[0], workers[1])
    _assert_same_weights(workers[0], single)
    # Training actually moved the weights (the comparison is not of two inits).
    init_sum = np.abs(_weights(single)[0]).sum()
    assert np.isfinite(init_sum) and float(single["eval_accuracy"]) > 0.5


def test_shm_equals_single_and_workers_agree(runs):
    # On the run below (plain SGD on shm: test_equality_matrix's shm cells, every rank).
    (single,), _, _ = runs["single_lamb_clip"]
    workers, model_dir, proc = runs["shm_accum_lamb_clip"]
    assert len(workers) == 2
    _assert_same_weights(workers[0], workers[1])
    _assert_same_weights(workers[0], single)
    for w in workers:  # each worker evaluates the whole test set
        np.testing.assert_allclose(w["eval_loss"], single["eval_loss"], rtol=1e-5)
    assert sorted(os.listdir(model_dir)) == CHIEF_FILES
    assert "[worker 0] tfdist: recipe=digits_mlp strategy=shm num_replicas=2" in proc.stdout
    assert "input sharding: RANK" in proc.stdout


def test_shm_accumulation_and_clipping_equal_single(runs):
    # 2 ranks x (2 accumulated global batches of 32), LAMB, clipped after the
    # reduction = one replica taking batches of 64.
    (single,), _, _ = runs["single_lamb_clip"]
    workers, model_dir, _ = runs["shm_accum_lamb_clip"]
    _assert_same_weights(workers[0], workers[1])
    _assert_same_weights(workers[0], single)
    metrics = json.load(open(os.path.join(model_dir, "metrics.json")))
    assert metrics["accumulate"] == 2 and metrics["effective_batch_size"] == 64


def test_shm_mixed_float16_scales_the_loss_and_ranks_agree(runs):
    workers, model_dir, _ = runs["shm_fp16"]
    metrics = json.load(open(os.path.join(model_dir, "metrics.json")))
    assert metrics["precision"] == "mixed_float16" and metrics["loss_scaling"] is True
    assert metrics["history"]["loss"][1] < metrics["history"]["loss"][0]
    for a, b in zip(_weights(workers[0]), _weights(workers[1])):
        np.testing.assert_array_equal(a, b)  # the same bits on both ranks
    assert float(workers[0]["eval_accuracy"]) > 0.5


def test_multi_worker_evaluate_and_predict_equal_single(runs):
    (single,), _, _ = runs["single"]
    workers, _, _ = runs["multi_worker"]
    for w in workers:
        np.testing.assert_allclose(w["eval_loss"], single["eval_loss"], rtol=1e-5)
        np.testing.assert_allclose(w["eval_accuracy"], single["eval_accuracy"], rtol=1e-6)
        assert w["predictions"].shape == single["predictions"].shape
        np.testing.assert_allclose(w["predictions"], single["predictions"], rtol=1e-4, atol=1e-5)


def test_only_chief_writes_model_dir(runs):
    _, model_dir, proc = runs["multi_worker"]
    assert sorted(os.listdir(model_dir)) == CHIEF_FILES
    assert sorted(os.listdir(os.path.join(model_dir, "backup"))) == [
        "ckpt-0000000022.npz", "ckpt-0000000044.npz"]
    # The chief logs; worker 1 prints only its start-up line (it names the
    # start-up timeout it waits under, which matters when the chief never comes).
    assert "[worker 0] tfdist: recipe=digits_mlp strategy=multi_worker num_replicas=2" in proc.stdout
    own = [line for line in proc.stdout.splitlines() if line.startswith("[worker 1] tfdist:")]
    assert len(own) == 1 and "starting; waiting up to" in own[0], own
    metrics = json.load(open(os.path.join(model_dir, "metrics.json")))
    assert metrics["num_replicas"] == 2 and metrics["strategy"] == "multi_worker"
    assert len(metrics["history"]["loss"]) == 2


def test_readme_multi_worker_command_trains_digits(shared_run):
    # The README's command with --epochs 3 --threads 1 --model-dir and the launcher's
    # --log-dir: test_first_hour's run (which checks its output is quiet), trained once.
    from tests.integration.test_first_hour import quiet_run

    proc, _, model_dir = shared_run(quiet_run)
    assert proc.returncode == 0, tail(proc)
    assert sorted(os.listdir(model_dir)) == CHIEF_FILES
    assert proc.stdout.count("wrote ") == 1 and "[worker 0] tfdist: test" in proc.stdout
    metrics = json.load(open(os.path.join(model_dir, "metrics.json")))
    assert metrics["num_replicas"] == 2 and metrics["global_batch_size"] == 64
    assert metrics["test"]["accuracy"] > 0.5  # chance is 0.1
    assert metrics["wall_time_s"] > 0 and metrics["examples_per_s"] > 0


def test_tfrecord_files_use_file_sharding(tmp_path):
    data_dir = str(tmp_path / "tfrecords")
    proc = run_py(["recipes/digits_mlp.py", data_dir, "4"])
    assert proc.returncode == 0, tail(proc)
    model_dir = str(tmp_path / "m")
    proc = run_py(["-m", "tfdist.launch", "-n", "2", "--timeout", "200", "--", "python", "-m",
                   "tfdist.train", "digits_mlp", "--data-dir", data_dir, "--epochs", "3",
                   "--model-dir", model_dir, "--verbose", "0", "--tensorboard"])
    assert proc.returncode == 0, tail(proc)
    assert "input sharding: AutoShardPolicy.FILE" in proc.stdout
    metrics = json.load(open(os.path.join(model_dir, "metrics.json")))
    assert metrics["shard_policy"] == "FILE" and metrics["test"]["accuracy"] > 0.5
    # TensorBoard: one event file, the chief's (a second worker would add its own).
    events = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(model_dir, "logs"))
              for f in fs if "tfevents" in f]
    assert len(events) == 1 and os.path.basename(os.path.dirname(events[0])) == "train", events


def test_accumulating_two_half_batches_equals_one_full_batch(runs):
    (single,), _, _ = runs["single"]
    dumps, model_dir, _ = runs["multi_worker_accum"]
    assert len(dumps) == 2
    for d in dumps:
        _assert_same_weights(d, single)
    metrics = json.load(open(os.path.join(model_dir, "metrics.json")))
    assert metrics["accumulate"] == 2 and metrics["effective_batch_size"] == 64
    assert metrics["global_step"] == 2 * 44  # micro-steps: 44 per epoch


def test_clipping_acts_on_the_reduced_gradient_lamb(runs):
    (single,), _, _ = runs["single_lamb_clip"]
    (mirrored,), model_dir, _ = runs["mirrored_lamb_clip"]
    _assert_same_weights(mirrored, single)
    plain, = runs["single"][0]
    assert not np.allclose(_weights(single)[0], _weights(plain)[0])  # lamb+clip changed the run
    metrics = json.load(open(os.path.join(model_dir, "metrics.json")))
    assert metrics["optimizer"] == "lamb" and metrics["clipnorm"] == 0.5


def test_mixed_float16_trains_with_loss_scaling(runs):
    (fp16,), model_dir, _ = runs["mirrored_fp16"]
    metrics = json.load(open(os.path.join(model_dir, "metrics.json")))
    assert metrics["precision"] == "mixed_float16" and metrics["loss_scaling"] is True
    assert float(fp16["eval_accuracy"]) > 0.5
    assert metrics["history"]["loss"][1] < metrics["history"]["loss"][0]


# Mixed precision. Every float16 matmul rounds its output to float16, and the
# weight gradient of a layer is one such matmul over the batch's rows: one
# replica rounds a sum over 64 examples once, 2 replicas round two sums of 32
# and add them in float32. That rounding, not the distribution, is what makes
# 1 and 2 replicas differ: 2 replicas are bit for bit the single replica that
# takes each batch in 2 accumulated halves (the loss of a half is scaled by a
# power of two, which float16 represents exactly), under every data-parallel
# strategy. Measured on digits_mlp, 2 epochs of SGD at lr 0.1: 1 vs 2 replicas
# differ by about 2e-4 after one epoch (max absolute weight difference).
FP16_SPLIT_ATOL = 5e-3  # about 10x the measured batch-splitting rounding after 2 epochs


@pytest.mark.parametrize("key", ["mirrored_fp16", "shm_fp16"])
def test_mixed_float16_replicas_equal_one_replica_taking_batches_in_halves(runs, key):
    (halves,), _, _ = runs["single_fp16_halves"]
    for worker in runs[key][0]:
        for a, b in zip(_weights(worker), _weights(halves)):
            np.testing.assert_array_equal(a, b)


def test_mixed_float16_one_vs_two_replicas_differ_only_by_float16_rounding(runs):
    (single,), _, _ = runs["single_fp16"]
    (mirrored,), _, _ = runs["mirrored_fp16"]
    diff = max(float(np.abs(a - b).max()) for a, b in zip(_weights(mirrored), _weights(single)))
    assert 0 < diff < FP16_SPLIT_ATOL, diff
