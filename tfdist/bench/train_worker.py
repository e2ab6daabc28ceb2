"""`python -m tfdist.bench.train_worker RECIPE [--key value ...]`: tfdist.train plus a step timer.

Trains exactly as `python -m tfdist.train` does (same parsing, same
`trainer.train`), adding only a callback that timestamps steps; the chief
prints the trainer's metrics and the steady-state step time as a result line.
Started by the benchmarks under `tfdist.launch` or `horovodrun`.
`TFDIST_BENCH_START_DIR` and `TFDIST_BENCH_START_PARTIES` (both set, or
neither) hold each process after its warm-up steps until that many processes
got there (`timing.start_barrier`): processes training alone, timed together.
`TFDIST_BENCH_DONE_DIR` and `TFDIST_BENCH_DONE_STEPS` (with the start
barrier) keep each process stepping until every one of them has run that
many steps, then end it there without a model or metrics.json
(`timing.until_all_done`): its steps stay contended to the last one timed.
`TFDIST_BENCH_TRACE=STEP,MS,DIR` traces every task of a job once
(`tfdist.bench.timeline`).
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    """Trains as `tfdist.train` would, then exits (a MultiWorkerMirrored task in order)."""
    from tfdist import cluster, train

    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.split("\n\n")[0] + "\n\nThe options are tfdist.train's:\n")
        return train.main(argv)
    warmup = int(os.environ.get("TFDIST_BENCH_WARMUP_STEPS", "3"))
    from tfdist.run import trainer
    from tfdist.bench import runs, timeline, timing

    recipe, cfg = train.parse(argv)
    timer = timing.step_timer()
    callbacks = [timer]
    if os.environ.get("TFDIST_BENCH_START_DIR"):
        callbacks.insert(0, timing.start_barrier(os.environ["TFDIST_BENCH_START_DIR"],
                                                 int(os.environ["TFDIST_BENCH_START_PARTIES"]),
                                                 after_steps=warmup))
    done_dir = os.environ.get("TFDIST_BENCH_DONE_DIR")
    if done_dir:  # after the timer, so that the last step is stamped
        callbacks.append(timing.until_all_done(done_dir,
                                               int(os.environ["TFDIST_BENCH_START_PARTIES"]),
                                               int(os.environ["TFDIST_BENCH_DONE_STEPS"])))
    info = cluster.detect()
    if os.environ.get(timeline.ENV) and info.num_tasks > 1:
        callbacks.append(timeline.trace_callback(info.worker_addresses,
                                                 os.environ[timeline.ENV]))
    try:
        result = trainer.train(recipe, cfg, info, callbacks=callbacks)
    except timing.AllDone:  # a process training alone (one task): it is its own chief
        from tfdist.settings import Settings

        gbs = Settings.of(cfg).training.global_batch_size
        step_s = timing.steady_step_s(timer.times, warmup)
        runs.emit({"strategy": "single", "num_replicas": 1, "num_workers": 1,
                   "global_batch_size": gbs, "steps": len(timer.times), "warmup_steps": warmup,
                   "step_s": step_s, "examples_per_s": gbs / step_s,
                   "step_end_times": timer.times})
        return 0
    if result.cluster.is_chief:
        m = result.metrics
        step_s = timing.steady_step_s(timer.times, warmup)
        runs.emit({"strategy": m["strategy"], "num_replicas": m["num_replicas"],
                   "num_workers": m["num_workers"], "global_batch_size": m["global_batch_size"],
                   "steps": len(timer.times), "warmup_steps": warmup,
                   "metrics_examples_per_s": m["examples_per_s"], "wall_time_s": m["wall_time_s"],
                   "step_s": step_s, "examples_per_s": m["global_batch_size"] / step_s,
                   # perf_counter: CLOCK_MONOTONIC on Linux, comparable across processes.
                   "step_end_times": timer.times,
                   "final_loss": m["history"]["loss"][-1] if m["history"].get("loss") else None})
    from tfdist.compat import tf_coordination_exit

    tf_coordination_exit.leave(info, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
