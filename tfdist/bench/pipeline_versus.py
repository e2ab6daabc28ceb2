"""`pipeline-processes --parts versus`: the pipeline against what a user would run instead (#50).

One model, every run alternated in each of `--repeats` rounds, each figure by
the wall clock (the median step of a run, after its warm-up):

- single: `--strategy single`, one process on all the machine's cores (what a
  user runs without tfdist's model parallelism);
- single, 1 core: the same pinned to one core with one thread (the arithmetic's
  unit: a stage process has one core);
- model_parallel: `--strategy model_parallel --devices P`, one process, the
  layers on P logical devices, no micro-batches;
- pipeline, 1 process: `--strategy pipeline --devices P`, M micro-batches
  (the largest of `--versus-microbatches`), one process on all cores;
- P stage processes, each pinned to a core of its own with one thread
  (`tfdist.launch --cpu-bind cores --threads 1`), at each M.

The stages' arithmetic: a stage does 1/P of one core's work, in M + P - 1
slots of 1/M of it: `plan.ideal_step_ratio` x the 1-core step. Where the time goes
beyond that: one stage-process run at the largest M traced by TensorFlow's
profiler (`tfdist.bench.timeline`), each task's op time per step by kind
(`timeline.by_kind`).
"""

from __future__ import annotations

import shlex
import shutil
import statistics
import sys
import tempfile

MODEL = ("model_parallel_mlp --hidden-layers 9 --hidden-units 2048 --global-batch-size 256 "
         "--optimizer adam")
TARGET_VS_SINGLE = 0.8  # #50: M = 8 on 2 pinned stage processes at most 0.8x single


def add_arguments(parser) -> None:
    """Flags of the versus part."""
    parser.add_argument("--versus-model", default=MODEL,
                        help="versus part: RECIPE [--key value ...]")
    parser.add_argument("--versus-microbatches", default="1,8",
                        help="versus part: M of the stage-process runs, comma-separated")
    parser.add_argument("--versus-schedule", default="1f1b", help="versus part: the schedule")
    parser.add_argument("--versus-steps", type=int, default=12,
                        help="versus part: training steps a run")
    parser.add_argument("--versus-trace", type=int, default=1,
                        help="versus part: 1 traces one stage-process run at the largest M "
                             "for the breakdown (0: no trace)")


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _points(args, ms: list[int]) -> list[tuple[str, list[str], dict]]:
    """(name, argv, how it runs) of each run of a round, stage runs at each M of `ms`."""
    p, top = args.time_stages, max(ms)
    base = [*shlex.split(args.versus_model), "--epochs", "1", "--verbose", "0", "--seed", "0",
            "--steps-per-epoch", str(args.versus_steps)]
    pipe = ["--strategy", "pipeline", "--schedule", args.versus_schedule]
    points = [("single", [*base, "--strategy", "single"], {"tasks": 1}),
              ("single_1core", [*base, "--strategy", "single", "--threads", "1"],
               {"tasks": 1, "share": f"0/{p}"}),
              ("model_parallel", [*base, "--strategy", "model_parallel", "--devices", str(p)],
               {"tasks": 1}),
              (f"pipeline_1proc_m{top}", [*base, *pipe, "--devices", str(p), "--microbatches",
                                          str(top)], {"tasks": 1})]
    for m in ms:
        points.append((f"stages_m{m}", [*base, *pipe, "--devices", "0", "--threads", "1",
                                        "--microbatches", str(m)], {"tasks": p, "bind": "cores"}))
    return points


def _run_point(run_job, args, argv, how, env=None) -> dict:
    return run_job(argv, how["tasks"], args.timeout, args.interval, bind=how.get("bind", "none"),
                   share=how.get("share"), warmup=args.warmup, env=env)


def _trace(run_job, args, argv, how) -> dict:
    from tfdist.bench import timeline

    logdir = tempfile.mkdtemp(prefix="tfdist-bench-versus-")
    try:
        point = _run_point(run_job, args, argv, how,
                           env={timeline.ENV: f"{args.warmup + 2},{args.timeline_ms},{logdir}"})
        ops, steps = timeline.read(logdir)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    summary = timeline.summarize(ops, steps)
    return {"median_step_s": point["median_step_s"], "summary": summary,
            "kinds": timeline.by_kind(ops, steps)}


def measure(args, run_job) -> dict:
    """Runs the part. `run_job(argv, tasks, timeout, interval, bind=, share=, warmup=, env=)`
    runs one job (`pipeline_processes._run`)."""
    from tfdist.model_parallel import plan

    ms = _ints(args.versus_microbatches)
    top = max(ms)
    points = _points(args, ms)
    per = {name: [] for name, _, _ in points}
    for r in range(args.repeats):
        for name, argv, how in (points if r % 2 == 0 else points[::-1]):
            print(f"pipeline-processes: versus {name}, repeat {r + 1}/{args.repeats}",
                  file=sys.stderr, flush=True)
            point = _run_point(run_job, args, argv, how)
            per[name].append({"step_s": point["median_step_s"],
                              "load_avg_1m": point["load_avg_1m"],
                              "final_loss": point["final_loss"]})
    p = args.time_stages
    out = {}
    for name, runs_ in per.items():
        out[name] = {"runs": runs_, "step_s": statistics.median(x["step_s"] for x in runs_),
                     # per round, against the single run of the same round
                     "vs_single": statistics.median(x["step_s"] / s["step_s"]
                                                    for x, s in zip(runs_, per["single"]))}
    for m in ms:
        point = out[f"stages_m{m}"]
        point["ideal_s"] = plan.ideal_step_ratio(p, m) * out["single_1core"]["step_s"]
        point["vs_ideal"] = point["step_s"] / point["ideal_s"]
    checks = {"stages_vs_single": out[f"stages_m{top}"]["vs_single"],
              "stages_vs_single_met": out[f"stages_m{top}"]["vs_single"] <= TARGET_VS_SINGLE,
              "pipeline_1proc_vs_model_parallel": statistics.median(
                  x["step_s"] / y["step_s"] for x, y in zip(per[f"pipeline_1proc_m{top}"],
                                                            per["model_parallel"]))}
    if len(ms) > 1:
        low = min(ms)
        checks[f"m{top}_vs_m{low}"] = statistics.median(
            x["step_s"] / y["step_s"] for x, y in zip(per[f"stages_m{top}"],
                                                      per[f"stages_m{low}"]))
    result = {"model": args.versus_model, "stages": p, "microbatches": ms,
              "schedule": args.versus_schedule, "steps": args.versus_steps,
              "repeats": args.repeats, "points": out, "checks": checks,
              "target_vs_single": TARGET_VS_SINGLE}
    if args.versus_trace:
        name, argv, how = next(x for x in points if x[0] == f"stages_m{top}")
        print(f"pipeline-processes: versus {name}, traced", file=sys.stderr, flush=True)
        result["trace"] = _trace(run_job, args, argv, how)
    return result


def table(result) -> str:
    """The runs side by side, then the traced stage run's op time by kind."""
    from tfdist.bench.report import format_table

    v = result["versus"]
    rows = []
    for name, point in v["points"].items():
        rows.append([name, point["step_s"] * 1e3, point["vs_single"],
                     point["ideal_s"] * 1e3 if "ideal_s" in point else "",
                     point.get("vs_ideal", ""),
                     " ".join(f"{x['step_s'] * 1e3:.0f}" for x in point["runs"]),
                     " ".join(f"{x['load_avg_1m']:.1f}" for x in point["runs"])])
    out = [f"{v['model']}, P={v['stages']}, {v['schedule']}: steps by the wall clock; "
           f"ideal = (M+P-1)/(MP) x single_1core\n" +
           format_table(["run", "step ms", "/ single", "ideal ms", "/ ideal", "each round ms",
                         "load"], rows),
           "checks: " + ", ".join(f"{k} {val:.3f}" if isinstance(val, float) else f"{k} {val}"
                                  for k, val in v["checks"].items())]
    trace = v.get("trace")
    if trace:
        kinds = sorted({k for task in trace["kinds"].values() for k in task["ms_per_step"]})
        rows = [[task, t["busy"], *(t["ms_per_step"].get(k, 0.0) for k in kinds)]
                for task, t in trace["kinds"].items()]
        out.append("traced stage run: each task's busy share of a step, and its ops' ms a "
                   "step by kind (ops on a task's two inter-op threads overlap, so the kinds "
                   "can sum past the step)\n" + format_table(["task", "busy", *kinds], rows))
    return "\n".join(out)


def plot(result, ax) -> None:
    """Each run's step against single's, the stages' ideal beside them."""
    v = result["versus"]
    names = list(v["points"])
    ax.bar(range(len(names)), [v["points"][n]["step_s"] * 1e3 for n in names])
    for i, n in enumerate(names):
        if "ideal_s" in v["points"][n]:
            ax.plot([i - 0.4, i + 0.4], [v["points"][n]["ideal_s"] * 1e3] * 2, "k--", lw=1)
    ax.axhline(v["points"]["single"]["step_s"] * 1e3 * v["target_vs_single"], color="r",
               ls=":", lw=1, label=f"{v['target_vs_single']} x single")
    ax.set_xticks(range(len(names)), [n.replace("_", "\n") for n in names], fontsize=6)
    ax.set_ylabel("step ms (wall clock)")
    ax.set_title(f"vs what a user runs instead, P={v['stages']}", fontsize=9)
    ax.legend(fontsize=6)
