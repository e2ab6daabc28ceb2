"""The equality matrix: every strategy x every optimizer x a dense and a sparse model.

Each strategy trains every cell in turn in one launched job
(tests/workers/equality_matrix.py, through `tfdist.setup()`), so the suite
pays each start-up once. Every cell must end with the single-replica weights
at rtol 1e-5 (float32); model_parallel and pipeline (1F1B, 2 micro-batches)
cut the attention model between its residual block and the head.
tensor_parallel (`model_parallel --devices 2 --tensor-parallel 2`: one stage
on 2 devices) splits the attention by heads and the feed-forward Dense pairs
(dense: d0 -> d1) by units, on the dense and attention models (chain's
only split would be another Dense pair); measured against one device,
every elementwise optimizer lands within 0.5 of the tolerance (Lion bit for
bit). LAMB and Adafactor read whole variables (LAMB's trust ratio, Adafactor's
RMS scaling and factored moments), which a shard is not: they end up to 9e-4
and 1.7 (absolute) from one device, a real difference, not rounding, so
tensor parallelism refuses them (`tensor_parallel.check_optimizer`).

multi_worker and shm reduce the gradients in buckets of about 1 KB
(`--bucket-mb 0.001`): several per model, each launched while the backward
pass goes on, and every cell still equals one replica.

Variants check the sparse path under gradient accumulation and compression,
and a negative control shows the check failing on Keras's own sparse updates
(shm before the fix).

One weight is left out of every comparison: the attention key projection's
bias. Softmax ignores a constant shift of the scores, so that bias gets no
gradient and only rounding noise; optimizers that normalise the step (Adam,
Lion, ...) turn that noise into full-size steps of random sign, so it
differs between any two summation orders, even between 1 and 2 replicas of
TensorFlow's own MirroredStrategy (measured: up to 4e-2 under Lion after 6
steps, while every other weight agrees to 1e-7).
"""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

from tests.conftest import REPO, WORKERS, clean_env, run_py, tail

pytestmark = pytest.mark.integration

WORKER = os.path.join(WORKERS, "equality_matrix.py")
RTOL, ATOL = 1e-5, 1e-6
FP16_ATOL = 1e-3  # as tests/integration/test_grad_compression.py: fp16 on the wire
NO_GRADIENT = ("mha/key/bias",)  # see the module docstring
DATA_PARALLEL = "dense,attention"
MODEL_PARALLEL = "dense,chain,attention"
TENSOR_PARALLEL = "dense,attention"
SPARSE_VARIANTS = "attention:adam:acc2,attention:rmsprop:acc2,attention:adam:fp16"
UPSTREAM = "attention:adam:upstream,attention:rmsprop:upstream"  # the negative control
# The all-reduce in buckets of ~1 KB, so each of these small models' gradients is
# reduced in several, each started during the backward pass (--bucket-mb, #31).
BUCKETS = "0.001"
HOROVOD_VENV = os.environ.get("TFDIST_HOROVOD_VENV",
                              os.path.expanduser("~/.cache/tfdist/horovod-venv"))

# strategy -> (how it is launched: processes, worker arguments)
JOBS = {
    # attention:sgd:clip: tests/integration/test_zero.py's clipped cell's reference.
    "single": (0, ["single", "--models", "dense,attention,chain", "--variants",
                   f"{UPSTREAM},attention:sgd:clip"]),
    "mirrored": (0, ["mirrored", "--devices", "2", "--models", DATA_PARALLEL,
                     "--variants", SPARSE_VARIANTS]),
    "multi_worker": (2, ["multi_worker", "--models", DATA_PARALLEL, "--bucket-mb", BUCKETS,
                         "--variants", SPARSE_VARIANTS]),
    "shm": (2, ["shm", "--models", DATA_PARALLEL, "--bucket-mb", BUCKETS, "--variants",
                f"{SPARSE_VARIANTS},{UPSTREAM}"]),
    "model_parallel": (0, ["model_parallel", "--devices", "2", "--models", MODEL_PARALLEL]),
    "pipeline": (0, ["pipeline", "--devices", "2", "--microbatches", "2", "--schedule", "1f1b",
                     "--models", MODEL_PARALLEL]),
    "tensor_parallel": (0, ["model_parallel", "--devices", "2", "--tensor-parallel", "2",
                            "--models", TENSOR_PARALLEL]),
}
# The matrix's optimizers that tensor parallelism refuses: they read whole variables
# (tfdist.optim.WHOLE_WEIGHT_OPTIMIZERS).
WHOLE_WEIGHT = ("lamb", "adafactor")


def _run(out, processes, args):
    if processes:
        proc = run_py(["-m", "tfdist.launch", "-n", str(processes), "--timeout", "400", "--",
                       "python", WORKER, args[0], out, *args[1:]], timeout=450)
    else:
        proc = run_py([WORKER, args[0], out, *args[1:]], timeout=400)
    assert proc.returncode == 0, tail(proc)
    return _load(out)


def _load(out):
    """{worker: {cell: weights dict, or the refusal's text}}; "init:MODEL" the starting
    weights, "state:ROW" a row's optimizer-state bytes (JSON)."""
    found = {}
    for worker in sorted(os.listdir(out)):
        cells = found.setdefault(worker, {})
        for name in sorted(os.listdir(os.path.join(out, worker))):
            path = os.path.join(out, worker, name)
            stem, ext = os.path.splitext(name)
            if ext == ".init":
                cells[f"init:{stem}"] = dict(np.load(path))
            elif ext == ".state":  # a row's optimizer-state bytes (tests/integration/test_zero.py)
                cells[f"state:{stem.removeprefix('state_')}"] = open(path).read()
            else:
                cells[stem] = dict(np.load(path)) if ext == ".npz" else open(path).read()
    return found


def single_reference(tmp):
    """The one-replica job, every cell's reference: test_zero's too (trained once,
    tests/integration/conftest.py)."""
    processes, args = JOBS["single"]
    return _run(os.path.join(tmp, "single"), processes, args)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory, request, shared_run):
    """A strategy's job, run the first time a test asks for it, or before: the jobs the
    selected tests of this module name (and the reference) start at once, two at a time
    (each process runs one intra-op thread; one job alone left a core idle: the module
    took 377 s run one job after another on the idle 2-core machine)."""
    from concurrent.futures import ThreadPoolExecutor

    tmp = tmp_path_factory.mktemp("matrix")
    pool = ThreadPoolExecutor(2)
    done = {}

    def start(strategy):
        if strategy == "single" and strategy not in done:
            done[strategy] = pool.submit(shared_run, single_reference)
        elif strategy not in done:
            processes, args = JOBS[strategy]
            done[strategy] = pool.submit(_run, str(tmp / strategy), processes, args)

    names = [item.name for item in request.session.items
             if item.module is request.module and "matrix" in item.fixturenames]
    for strategy in JOBS:  # "single" first: every comparison needs it
        if strategy == "single" or any(strategy in name for name in names):
            start(strategy)

    def get(strategy):
        start(strategy)
        return done[strategy].result()

    yield get
    pool.shutdown(wait=True, cancel_futures=True)


def _compared(weights):
    return {k: v for k, v in weights.items() if k not in NO_GRADIENT}


def _assert_equal_weights(got, want, rtol=RTOL, atol=ATOL, cell=""):
    got, want = _compared(got), _compared(want)
    assert sorted(got) == sorted(want), cell
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=rtol, atol=atol,
                                   err_msg=f"{cell}: {key}")


def _check_strategy(strategy, workers, reference, refused=()):
    cells = workers["worker0"]
    plain = [c for c in cells if c.count("-") == 1 and not c.startswith(("init:", "state:"))
             and c.split("-")[1] not in refused]
    least = 2 * (12 - len(refused))  # 12 optimizers (less those refused) x at least 2 models
    assert len(plain) >= least, sorted(cells)
    trained = 0
    for cell in plain:
        got = cells[cell]
        assert not isinstance(got, str), f"{strategy} refused {cell}: {got}"
        _assert_equal_weights(got, reference[cell], cell=f"{strategy} {cell}")
        trained += 1
        for other in workers.values():  # every worker applied the same reduced gradients
            for key, value in got.items():
                np.testing.assert_array_equal(other[cell][key], value, err_msg=cell)
    assert trained >= least, trained


def test_single_replica_training_moved_every_weight_it_compares(matrix):
    # Guards against comparing two initialisations: each reference cell trained.
    cells = matrix("single")["worker0"]
    plain = [c for c in cells if c.count("-") == 1 and not c.startswith(("init:", "state:"))]
    assert len(plain) == 36, sorted(cells)  # 12 optimizers x 3 models
    for cell in plain:
        start = _compared(cells[f"init:{cell.split('-')[0]}"])
        moved = _compared(cells[cell])
        # Each weight moved 100 times the absolute tolerance, so equality says something.
        still = {k: float(np.abs(moved[k] - start[k]).max()) for k in start}
        assert min(still.values()) > 100 * ATOL, (cell, sorted(still.items(), key=lambda i: i[1]))


@pytest.mark.parametrize("strategy", ["mirrored", "multi_worker", "shm", "model_parallel",
                                      "pipeline"])
def test_every_cell_equals_single_replica(matrix, strategy):
    reference = matrix("single")["worker0"]
    workers = matrix(strategy)
    expected = 1 if strategy in ("mirrored", "model_parallel", "pipeline") else 2
    assert len(workers) == expected
    _check_strategy(strategy, workers, reference)


def test_tensor_parallel_cells_equal_single_replica(matrix):
    reference = matrix("single")["worker0"]
    workers = matrix("tensor_parallel")
    assert len(workers) == 1
    # The split happened: heads and feed-forward pairs on both devices, the rest whole.
    split = dict(line.split() for line in workers["worker0"]["split"].splitlines())
    assert {k: v for k, v in split.items() if "Parallel" in v} == {
        "attention_mha": "HeadParallelAttention", "dense_d0": "ColumnParallelDense",
        "dense_d1": "RowParallelDense"}, split
    _check_strategy("tensor_parallel", workers, reference, refused=WHOLE_WEIGHT)


def test_tensor_parallel_refuses_optimizers_that_read_whole_variables(matrix):
    cells = matrix("tensor_parallel")["worker0"]
    for model in TENSOR_PARALLEL.split(","):
        for optimizer in WHOLE_WEIGHT:
            refusal = cells[f"{model}-{optimizer}"]
            assert isinstance(refusal, str), f"{model}-{optimizer} trained on shards"
            assert "whole variable" in refusal and "no tensor parallelism" in refusal, refusal


@pytest.mark.parametrize("strategy", ["mirrored", "multi_worker", "shm"])
def test_sparse_gradients_accumulated_equal_one_full_batch(matrix, strategy):
    reference = matrix("single")["worker0"]
    cells = matrix(strategy)["worker0"]
    for optimizer in ("adam", "rmsprop"):
        _assert_equal_weights(cells[f"attention-{optimizer}-acc2"],
                              reference[f"attention-{optimizer}"],
                              cell=f"{strategy} attention-{optimizer}-acc2")


@pytest.mark.parametrize("strategy", ["mirrored", "multi_worker", "shm"])
def test_sparse_gradients_compressed_stay_within_fp16_rounding(matrix, strategy):
    reference = _compared(matrix("single")["worker0"]["attention-adam"])
    got = _compared(matrix(strategy)["worker0"]["attention-adam-fp16"])
    diff = max(float(np.abs(got[k] - reference[k]).max()) for k in reference)
    assert 0 < diff < FP16_ATOL, diff  # the casts happened, and cost only their rounding


def test_keras_sparse_updates_fail_the_check_on_shm(matrix):
    # The negative control, tfdist before the fix: with Keras's own sparse updates
    # one replica applies repeated embedding rows separately while 2 shm ranks sum
    # them densely; the check must catch the difference.
    reference = matrix("single")["worker0"]
    cells = matrix("shm")["worker0"]
    for optimizer in ("adam", "rmsprop"):
        got = _compared(cells[f"attention-{optimizer}-upstream"])
        want = _compared(reference[f"attention-{optimizer}-upstream"])
        diff = max(float(np.abs(got[k] - want[k]).max()) for k in want)
        assert diff > 1e-3, (optimizer, diff)


@pytest.fixture(scope="module")
def horovod_runs(tmp_path_factory):
    """2 Gloo ranks and their single-replica reference, both in the Horovod venv (TF 2.18)."""
    from tests.integration.test_horovod import horovodrun

    python = os.path.join(HOROVOD_VENV, "bin", "python")
    if not os.access(python, os.X_OK):
        reason = f"no Horovod venv at {HOROVOD_VENV}: run scripts/install_horovod.sh"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Horovod matrix, but {reason}")
        pytest.skip(reason)
    from concurrent.futures import ThreadPoolExecutor

    tmp = tmp_path_factory.mktemp("hvd_matrix")
    single, ranks = str(tmp / "single"), str(tmp / "horovod")
    # The reference and the ranks side by side (one intra-op thread each): they ran one
    # after the other, 78 s on the idle 2-core machine.
    with ThreadPoolExecutor(2) as pool:
        reference = pool.submit(
            subprocess.run, [python, WORKER, "single", single, "--models", DATA_PARALLEL],
            capture_output=True, text=True, timeout=400, cwd=REPO,
            env=clean_env(PYTHONPATH=REPO))
        ranked = pool.submit(
            horovodrun, HOROVOD_VENV, 2, "gloo", [WORKER, "horovod", ranks, "--models",
                                                  DATA_PARALLEL, "--variants", SPARSE_VARIANTS],
            timeout=450)
        for proc in (reference.result(), ranked.result()):
            assert proc.returncode == 0, tail(proc)
    return _load(single)["worker0"], _load(ranks)


def test_horovod_every_cell_equals_single_replica(horovod_runs):
    reference, workers = horovod_runs
    assert len(workers) == 2
    _check_strategy("horovod", workers, reference)
    cells = workers["worker0"]
    for optimizer in ("adam", "rmsprop"):  # sparse gradients, 2 accumulated half batches
        _assert_equal_weights(cells[f"attention-{optimizer}-acc2"],
                              reference[f"attention-{optimizer}"],
                              cell=f"horovod attention-{optimizer}-acc2")
    got, want = _compared(cells["attention-adam-fp16"]), _compared(reference["attention-adam"])
    diff = max(float(np.abs(got[k] - want[k]).max()) for k in want)
    assert 0 < diff < FP16_ATOL, diff
