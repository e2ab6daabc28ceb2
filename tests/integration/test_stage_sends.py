"""Why a pipeline's stage tasks get two inter-op threads (`stages.inter_op_threads`, #29).

Two stage processes, each bound to its own core (`tfdist.launch --cpu-bind
cores`), M = 4 micro-batches, every task traced by TensorFlow's profiler
(`tfdist.bench.timeline`). With one inter-op thread, TensorFlow's executor
queues each forward's `_Send` behind the stage's next forwards, so stage 1's
first forward starts only after stage 0's last: the forward is not pipelined
(the upstream behaviour). With tfdist's default of two, stage 1 computes a
micro-batch while stage 0 computes the next (in most steps: the two threads
share one core). Either order is settled per run, and a run in about five
keeps the other one throughout, so each claim is asked of one of three runs.
"""

from __future__ import annotations

import pytest

from tests.conftest import REPO, clean_env, run_py, tail
from tfdist.bench import runs, timeline

pytestmark = pytest.mark.integration

# 2 Dense 512x512 a stage (each forward ~1 ms on this machine), batch 1024, M = 4: a
# batch whose rows outweigh the kernels, so each micro-batch's backward makes its weight
# gradients (batched_weight_grads leaves those to the step's end where the kernels
# outweigh the rows, and the graph it makes did not show the held sends).
ARGS = ["model_parallel_mlp", "--hidden-layers", "5", "--hidden-units", "512",
        "--global-batch-size", "1024", "--epochs", "1", "--steps-per-epoch", "14",
        "--verbose", "0", "--seed", "0", "--threads", "1", "--strategy", "pipeline",
        "--devices", "0", "--microbatches", "4"]


def _forward(name):
    return "gradient_tape" not in name and "MatMul" in name.rsplit(":", 1)[1]


def _stage1_waits_for_all_of_stage0s_forwards(tmp_path, extra):
    logdir = str(tmp_path / "trace")
    cmd = runs.launch_command(2, "tfdist.bench.train_worker",
                              [*ARGS, *extra, "--model-dir", str(tmp_path / "run")], 150,
                              cpu_bind="cores")
    proc = run_py(cmd[1:], timeout=200, cwd=REPO,  # cmd[0] is this Python
                  env=clean_env(**{timeline.ENV: f"5,600,{logdir}",
                                   "TFDIST_BENCH_WARMUP_STEPS": "3"}))
    assert proc.returncode == 0, tail(proc)
    ops, steps = timeline.read(logdir)
    whole = [(a, b) for a, b in steps if a >= min(s for s, _, _ in ops[1])]
    assert len(whole) >= 2, (steps, tail(proc))
    waited = []
    for a, b in whole[:-1]:
        ends = [e for s, e, n in ops[0] if a <= s < b and _forward(n)]
        starts = [s for s, e, n in ops[1] if a <= s < b and _forward(n)]
        assert len(ends) >= 8 and starts, (len(ends), len(starts))  # 2 layers x 4 each
        waited.append(min(starts) > max(ends))
    return waited


def _some_run_shows(tmp_path, extra, pattern, runs=3):
    """Whether one of up to `runs` traced runs shows `pattern` (over its steps' waits).

    Which order a run settles into is decided per run, not per step: about one
    run in five here keeps the other order in (almost) every step, for either
    thread count (seen once in CI for one thread, once locally for two). So each
    claim must hold in one of three runs; a change upstream fails all three.
    """
    seen = []
    for i in range(runs):
        waited = _stage1_waits_for_all_of_stage0s_forwards(tmp_path / str(i), extra)
        if pattern(waited):
            return True
        seen.append(waited)
    raise AssertionError(f"{extra or 'default'}: no run showed the pattern; waits per run: {seen}")


def test_one_inter_op_thread_holds_every_send_until_the_last_forward_two_do_not(tmp_path):
    # The upstream behaviour: stage 1 starts after stage 0's last forward, every step.
    assert _some_run_shows(tmp_path / "one", ["--inter-op-threads", "1"], all)
    # tfdist's default (two threads): stage 1 starts while stage 0 still runs forwards,
    # in most steps. Not all: both threads share stage 0's one core, and in a step where
    # the kernel keeps the forward thread running the sends can still wait (a CI run
    # saw it in 1 step of 7).
    assert _some_run_shows(tmp_path / "default", [],
                           lambda waited: sum(waited) < len(waited) / 2)
