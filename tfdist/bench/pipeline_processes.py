"""`pipeline-processes`: the pipeline with each stage in a process of its own (#29), measured.

Every point is a real job: `tfdist.launch -n P` running `tfdist.bench.train_worker`
(the trainer itself) with `--strategy pipeline --devices 0`, one stage per task,
the chief (task 0) holding stage 0 and driving the run. Its parts:

- memory: each task's peak resident memory (VmHWM, `tfdist.bench.memory`) for
  P = 1 (one process, `--strategy single`) and P stage processes, on a model
  whose weights and Adam slots are large. Each stage's peak is given as a
  fraction of the one-process peak, up to the end of the last training step
  ("train") and over the whole run ("run": the chief's backup at the epoch's
  end and the saved model come after training), beside the stage's share of
  the parameters (the chief's placement table).
- time: the steady step time of M micro-batches on P stage processes, each
  pinned to its own core (`tfdist.launch --cpu-bind cores`), against the same
  micro-batching in one process pinned to one core (`--strategy pipeline
  --devices P` on logical devices, under `tfdist.bench.bind --share 0/P`), at
  each of `--time-batch-sizes` (rows per micro-batch: batch / M).
  GPipe's ideal for that ratio is (M + P - 1) / (M P). Runs alternate
  `--repeats` times; each run's figure is its median step (the machine is
  shared, a step slowed by another job is an outlier, not the pipeline); the
  headline is the median of the per-repeat ratios.
- schedule: GPipe against 1F1B at the same M on P stage processes: each task's
  peak, on a model whose activations outweigh its weights (narrow layers, a
  large batch). A stage holds M micro-batches' activations under GPipe and at
  most P - s under 1F1B (`schedules.peak_in_flight`).
- schedules: 1F1B against interleaved 1F1B and zero bubble on P pinned stage
  processes, alternated, measured bubble against each schedule's formula
  (`tfdist.bench.pipeline_schedules`; not in the default parts).
- versus: the pipeline against what a user would run instead, by the wall
  clock: one process on all cores, `--strategy model_parallel`, the pipeline
  in one process, and P pinned stage processes at each M, with a traced
  breakdown of the stage run (`tfdist.bench.pipeline_versus`, #50).
- chief: a whole run (train, back up, resume, final weights) on P stage
  processes, the chief's peak against its stage's share plus its role's
  baseline, the same run with 8-unit layers (`tfdist.bench.chief_peak`; #40's
  must-show).
- timeline: the time part's pipeline run once with every task traced by
  TensorFlow's profiler (`tfdist.bench.timeline`): each task's busy share of
  the traced steps and its longest idle gaps, with the ops either side (not in
  the default parts: it is a diagnosis, not a figure).

Every figure is a single machine's, with the load average at each run beside it.
"""

from __future__ import annotations

import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile

from tfdist.bench import chief_peak, memory, pipeline_schedules, pipeline_versus, runs

DESCRIPTION = ("pipeline stages in processes: per-process peak memory, pinned step time vs "
               "GPipe's ideal, GPipe vs 1F1B memory")
PARTS = ("memory", "time", "schedule", "chief", "timeline", "schedules", "versus")
DEFAULT_PARTS = ("memory", "versus", "schedule", "chief")
MEMORY_MODEL = runs.LARGE_MLP
# 4 Dense 2048x2048 layers (#29's shape): 2 equal stages of 2.
TIME_MODEL = "model_parallel_mlp --hidden-layers 5 --hidden-units 2048"
# Micro-batches of 8 rows (#29's shape: each 16 MB weight matrix streamed from memory at 2
# flops a byte, where a hand-off between processes costs most) and of 64 rows.
TIME_BATCH_SIZES = "64,512"
# 256-wide layers at batch 32768: 32 MB of activations per layer per batch, 0.26 MB of weights.
SCHEDULE_MODEL = ("wide_mlp --input-dim 256 --hidden-units 256 --hidden-layers 8 "
                  "--global-batch-size 32768 --num-examples 32768")
COMMON = ["--epochs", "1", "--verbose", "0", "--seed", "0", "--learning-rate", "0.001"]
TARGET_FRACTION = 0.65  # #29: a stage of 2 at most its share plus TensorFlow's baseline
TARGET_VS_IDEAL = 1.15  # #29: within 15% of GPipe's ideal
MIB = memory.MB


def add_arguments(parser):
    """Flags of this benchmark."""
    parser.add_argument("--parts", default=",".join(DEFAULT_PARTS),
                        help=f"comma-separated, of {', '.join(PARTS)} (default: "
                             f"{','.join(DEFAULT_PARTS)})")
    parser.add_argument("--memory-stages", default="1,2,4",
                        help="stage processes P (1: one process, --strategy single)")
    parser.add_argument("--memory-microbatches", default="1,4",
                        help="micro-batch counts of each P > 1 run (GPipe)")
    parser.add_argument("--memory-model", default=MEMORY_MODEL,
                        help="RECIPE [--key value ...] of the memory part")
    parser.add_argument("--memory-steps", type=int, default=3, help="training steps per run")
    parser.add_argument("--time-model", default=TIME_MODEL,
                        help="RECIPE [--key value ...] of the time part")
    parser.add_argument("--time-batch-sizes", default=TIME_BATCH_SIZES,
                        help="global batch sizes of the time part's model, comma-separated "
                             "(a micro-batch is batch / M rows)")
    parser.add_argument("--time-stages", type=int, default=2, help="P of the time part")
    parser.add_argument("--time-microbatches", type=int, default=8, help="M of the time part")
    parser.add_argument("--time-steps", type=int, default=20, help="training steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="steps not timed (tracing)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="time part: pipeline and baseline runs, alternated")
    parser.add_argument("--schedule-model", default=SCHEDULE_MODEL,
                        help="RECIPE [--key value ...] of the schedule part")
    parser.add_argument("--schedule-stages", type=int, default=2, help="P of the schedule part")
    parser.add_argument("--schedule-microbatches", type=int, default=8,
                        help="M of the schedule part")
    parser.add_argument("--schedule-steps", type=int, default=3, help="training steps per run")
    parser.add_argument("--timeline-ms", type=int, default=2000,
                        help="timeline part: milliseconds traced, after the warm-up")
    parser.add_argument("--timeline-schedule", default="gpipe",
                        help="timeline part: the schedule traced (interleaved takes "
                             "--virtual-stages)")
    parser.add_argument("--timeline-dir", default="",
                        help="timeline part: keep the XPlane files here (default: a "
                             "temporary directory, removed)")
    pipeline_schedules.add_arguments(parser)
    pipeline_versus.add_arguments(parser)
    chief_peak.add_arguments(parser)
    parser.add_argument("--interval", type=float, default=0.05,
                        help="seconds between memory samples")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run")


def median_step_s(times: list[float], warmup: int) -> float:
    """Pure function: the median step of the step-end `times` after the first `warmup` steps.

    Raises:
        ValueError: with fewer than warmup + 2 times.
    """
    if len(times) < warmup + 2:
        raise ValueError(f"need at least warmup + 2 = {warmup + 2} step times. "
                         f"Received: {len(times)}.")
    return statistics.median(b - a for a, b in zip(times[warmup:], times[warmup + 1:]))


_TOTAL = re.compile(r"^(?:\[worker \d+\] )?total\s+task:(\d+)/\S+\s+(\d+)\s+(\d+)")


def stage_totals(stdout: str) -> dict[int, dict]:
    """Pure function: {task: {"params", "bytes"}} from the chief's placement table."""
    out = {}
    for line in stdout.splitlines():
        match = _TOTAL.match(line.strip())
        if match:
            out[int(match.group(1))] = {"params": int(match.group(2)),
                                        "bytes": int(match.group(3))}
    return out


def _parse_ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _run(argv: list[str], tasks: int, timeout_s: float, interval_s: float, *,
         bind: str = "none", share: str | None = None, warmup: int = 1,
         env: dict | None = None, horovod_venv: str | None = None) -> dict:
    """One training job of `tasks` processes (1: no launcher); its result line and memory.

    With `horovod_venv`, the tasks are `horovodrun --gloo` ranks of that venv's
    Python instead of `tfdist.launch` workers.

    Raises:
        RuntimeError: when it fails or prints no result, with its output's tail.
    """
    model_dir = tempfile.mkdtemp(prefix="tfdist-bench-pp-")
    worker = [sys.executable, "-m", "tfdist.bench.train_worker", *argv, "--model-dir", model_dir]
    if horovod_venv:
        cmd = runs.horovod_command(horovod_venv, tasks, "gloo", "tfdist.bench.train_worker",
                                   [*argv, "--model-dir", model_dir], cpu_bind=bind)
    elif tasks > 1:
        cmd = runs.launch_command(tasks, "tfdist.bench.train_worker",
                                  [*argv, "--model-dir", model_dir], timeout_s, cpu_bind=bind)
    elif share:
        cmd = [sys.executable, "-m", "tfdist.bench.bind", "--share", share, "--", *worker]
    else:
        cmd = worker
    load = runs.load_average()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=runs.REPO, env=runs.child_env(
                                    {"TFDIST_BENCH_WARMUP_STEPS": str(warmup), **(env or {})}))
        sampler = memory.Sampler(proc.pid, tasks, interval_s)
        with sampler:
            try:
                stdout, stderr = proc.communicate(timeout=timeout_s + 60)
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, stderr = proc.communicate()
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)
    results = runs.parse(stdout)
    if proc.returncode != 0 or not results:
        raise RuntimeError(f"run failed (rc={proc.returncode}): {shlex.join(cmd)}\n"
                           f"{stdout[-2000:]}\n{stderr[-3000:]}")
    result = results[0]
    times = result["step_end_times"]
    start, end = times[warmup], times[-1]
    procs = []
    for task, samples in sorted(sampler.samples.items()):
        train, whole = memory.peaks(samples, until=end), memory.peaks(samples)
        cpu, wait = (memory.between(samples, start, end, field) for field in (3, 4))
        steps = len(times) - 1 - warmup
        procs.append({"task": task, "train_peak_bytes": train["hwm_bytes"],
                      "run_peak_bytes": whole["hwm_bytes"], "samples": whole["samples"],
                      # Over the timed steps: CPU seconds per step, the fraction of a core
                      # that is, and its threads' seconds runnable but waiting for a core.
                      "cpu_s_per_step": None if cpu is None else cpu / steps,
                      "cpu_share": None if cpu is None else cpu / (end - start),
                      "wait_s_per_step": None if wait is None else wait / steps})
    return {"command": shlex.join(cmd), "load_avg_1m": load, "load_avg_1m_end":
            runs.load_average(), "step_s": result["step_s"],
            "median_step_s": median_step_s(result["step_end_times"], warmup),
            "final_loss": result["final_loss"], "processes": procs,
            "stage_totals": {str(k): v for k, v in stage_totals(stdout).items()}}


def _recipe_args(text: str, steps: int) -> list[str]:
    return [*shlex.split(text), *COMMON, "--steps-per-epoch", str(steps)]


def _pipeline_args(microbatches: int, schedule: str = "gpipe") -> list[str]:
    return ["--strategy", "pipeline", "--devices", "0", "--microbatches", str(microbatches),
            "--schedule", schedule]


def _memory(args) -> dict:
    base = _recipe_args(args.memory_model, args.memory_steps)
    runs_out = []
    for p in _parse_ints(args.memory_stages):
        for m in ([1] if p == 1 else _parse_ints(args.memory_microbatches)):
            extra = ["--strategy", "single"] if p == 1 else _pipeline_args(m)
            print(f"pipeline-processes: memory P={p} M={m}", file=sys.stderr, flush=True)
            point = _run([*base, *extra], p, args.timeout, args.interval)
            runs_out.append({"stages": p, "microbatches": m, **point})
    single = next((r for r in runs_out if r["stages"] == 1), None)
    if single:
        one = single["processes"][0]
        for r in runs_out:
            total = sum(v["params"] for v in r["stage_totals"].values()) or None
            for proc in r["processes"]:
                proc["train_fraction"] = proc["train_peak_bytes"] / one["train_peak_bytes"]
                proc["run_fraction"] = proc["run_peak_bytes"] / one["run_peak_bytes"]
                share = r["stage_totals"].get(str(proc["task"]))
                proc["param_share"] = share["params"] / total if share and total else 1.0
    return {"model": args.memory_model, "steps": args.memory_steps, "runs": runs_out,
            "target_fraction": TARGET_FRACTION}


def _time(args) -> dict:
    p, m = args.time_stages, args.time_microbatches
    from tfdist.model_parallel import plan

    ideal = plan.ideal_step_ratio(p, m)
    points = []
    for batch in _parse_ints(args.time_batch_sizes):
        base = [*_recipe_args(args.time_model, args.time_steps), "--global-batch-size",
                str(batch), "--threads", "1", "--microbatches", str(m), "--strategy",
                "pipeline", "--schedule", "gpipe"]
        pairs = []
        for r in range(args.repeats):
            print(f"pipeline-processes: time batch {batch}, repeat {r + 1}/{args.repeats}",
                  file=sys.stderr, flush=True)
            staged = _run([*base, "--devices", "0"], p, args.timeout, args.interval,
                          bind="cores", warmup=args.warmup)
            one = _run([*base, "--devices", str(p)], 1, args.timeout, args.interval,
                       share=f"0/{p}", warmup=args.warmup)
            pairs.append({"stages": staged, "one_process": one,
                          "ratio": staged["median_step_s"] / one["median_step_s"]})
        ratio = statistics.median(pair["ratio"] for pair in pairs)
        points.append({
            "global_batch_size": batch, "microbatch_rows": batch // m, "repeats": pairs,
            "ratio": ratio, "vs_ideal": ratio / ideal,
            "stages_step_s": statistics.median(x["stages"]["median_step_s"] for x in pairs),
            "one_process_step_s": statistics.median(
                x["one_process"]["median_step_s"] for x in pairs)})
    return {"model": args.time_model, "stages": p, "microbatches": m, "steps": args.time_steps,
            "warmup": args.warmup, "ideal_ratio": ideal, "target_vs_ideal": TARGET_VS_IDEAL,
            "points": points}


def _schedule(args) -> dict:
    from tfdist.model_parallel import schedules

    p, m = args.schedule_stages, args.schedule_microbatches
    base = _recipe_args(args.schedule_model, args.schedule_steps)
    out = {}
    for name in ("gpipe", "1f1b"):
        print(f"pipeline-processes: schedule {name} P={p} M={m}", file=sys.stderr, flush=True)
        point = _run([*base, *_pipeline_args(m, name)], p, args.timeout, args.interval)
        in_flight = [schedules.peak_in_flight(a) for a in schedules.build(name, p, m)]
        for proc in point["processes"]:
            proc["in_flight"] = in_flight[proc["task"]]
        out[name] = point
    saved = {str(proc["task"]): g["train_peak_bytes"] - proc["train_peak_bytes"]
             for g, proc in zip(out["gpipe"]["processes"], out["1f1b"]["processes"])}
    return {"model": args.schedule_model, "stages": p, "microbatches": m, "runs": out,
            "gpipe_minus_1f1b_bytes": saved}


def _timeline(args) -> dict:
    from tfdist.bench import timeline
    from tfdist.model_parallel import plan

    p, m = args.time_stages, args.time_microbatches
    logdir = args.timeline_dir or tempfile.mkdtemp(prefix="tfdist-bench-timeline-")
    # Steps to outlast the trace: 3 a second and 5 more (the time model's take 0.15-0.25 s
    # at batch 64).
    steps = args.warmup + 2 + max(10, int(args.timeline_ms / 1000 * 3) + 5)
    batch = _parse_ints(args.time_batch_sizes)[0]
    argv = [*_recipe_args(args.time_model, steps), "--global-batch-size", str(batch),
            "--threads", "1", *_pipeline_args(m, args.timeline_schedule)]
    if args.timeline_schedule == "interleaved":
        argv += ["--virtual-stages", str(args.virtual_stages)]
    print(f"pipeline-processes: timeline P={p} M={m} batch {batch}", file=sys.stderr,
          flush=True)
    try:
        point = _run(argv, p, args.timeout, args.interval, bind="cores", warmup=args.warmup,
                     env={timeline.ENV: f"{args.warmup + 2},{args.timeline_ms},{logdir}"})
        ops, steps_ms = timeline.read(logdir)
    finally:
        if not args.timeline_dir:
            shutil.rmtree(logdir, ignore_errors=True)
    summary = timeline.summarize(ops, steps_ms)
    return {"model": args.time_model, "global_batch_size": batch, "stages": p, "microbatches": m,
            "schedule": args.timeline_schedule,
            "ideal_busy": 1 - plan.bubble_fraction(p, m), "median_step_s": point["median_step_s"],
            "load_avg_1m": point["load_avg_1m"], "summary": summary,
            "kept": args.timeline_dir or None}


def _schedules(args) -> dict:
    return pipeline_schedules.measure(args, _run)


def _versus(args) -> dict:
    return pipeline_versus.measure(args, _run)


def run(args) -> dict:
    """Runs the parts asked for; returns the JSON-able result."""
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise ValueError(f"--parts takes {', '.join(PARTS)}. Received: {unknown}.")
    out = {"config": {k: v for k, v in vars(args).items() if k != "command"},
           "load_avg_1m_start": runs.load_average()}
    for part in PARTS:
        if part in parts:
            out[part] = {"memory": _memory, "time": _time, "schedule": _schedule,
                         "chief": chief_peak.measure, "timeline": _timeline,
                         "schedules": _schedules, "versus": _versus}[part](args)
    out["load_avg_1m_end"] = runs.load_average()
    return out


def _mib(n: int) -> float:
    return n / MIB


def table(result) -> str:
    """One table per part."""
    from tfdist.bench.report import format_table

    out = []
    if "memory" in result:
        rows = []
        for r in result["memory"]["runs"]:
            for proc in r["processes"]:
                rows.append([r["stages"], r["microbatches"], proc["task"],
                             proc.get("param_share", 1.0), _mib(proc["train_peak_bytes"]),
                             proc.get("train_fraction", 0.0), _mib(proc["run_peak_bytes"]),
                             proc.get("run_fraction", 0.0), r["load_avg_1m"]])
        out.append(format_table(["P", "M", "task", "param share", "train peak MiB", "/ 1 proc",
                                 "run peak MiB", "/ 1 proc", "load"], rows))
    if "time" in result:
        t = result["time"]

        def cpu(run, key, scale=1.0):
            return "/".join("-" if proc[key] is None else f"{proc[key] * scale:.3g}"
                            for proc in run["processes"])

        rows = []
        for point in t["points"]:
            for i, x in enumerate(point["repeats"]):
                rows.append([
                    point["global_batch_size"], i, x["stages"]["median_step_s"] * 1e3,
                    x["one_process"]["median_step_s"] * 1e3, x["ratio"],
                    x["ratio"] / t["ideal_ratio"], cpu(x["stages"], "cpu_s_per_step", 1e3),
                    cpu(x["one_process"], "cpu_s_per_step", 1e3), cpu(x["stages"], "cpu_share"),
                    cpu(x["one_process"], "cpu_share"), cpu(x["stages"], "wait_s_per_step", 1e3),
                    cpu(x["one_process"], "wait_s_per_step", 1e3), x["stages"]["load_avg_1m"]])
            rows.append([point["global_batch_size"], "median", point["stages_step_s"] * 1e3,
                         point["one_process_step_s"] * 1e3, point["ratio"], point["vs_ideal"],
                         "", "", "", "", "", "", ""])
        out.append(f"P={t['stages']} M={t['microbatches']}: ideal (M+P-1)/(MP) = "
                   f"{t['ideal_ratio']:.4g}; per task: CPU ms per step, the share of a core "
                   "that is, ms per step its threads waited for a core\n" +
                   format_table(["batch", "repeat", f"{t['stages']} procs ms", "1 proc ms",
                                 "ratio", "/ ideal", "CPU ms", "1 proc CPU", "core share",
                                 "1 proc share", "wait ms", "1 proc wait", "load"], rows))
    if "schedule" in result:
        s = result["schedule"]
        rows = []
        for name, point in s["runs"].items():
            for proc in point["processes"]:
                rows.append([name, proc["task"], proc["in_flight"],
                             _mib(proc["train_peak_bytes"]), point["median_step_s"] * 1e3,
                             point["load_avg_1m"]])
        out.append(f"P={s['stages']} M={s['microbatches']}: GPipe - 1F1B train peak MiB " +
                   ", ".join(f"task {k}: {_mib(v):.1f}"
                             for k, v in s["gpipe_minus_1f1b_bytes"].items()) + "\n" +
                   format_table(["schedule", "task", "in flight", "train peak MiB", "step ms",
                                 "load"], rows))
    if "chief" in result:
        out.append(chief_peak.table(result["chief"]))
    if "timeline" in result:
        t = result["timeline"]
        summary = t["summary"]
        rows = []
        for task, v in summary["tasks"].items():
            median = v["median_step_busy"]
            rows.append([task, v["window_busy"], "-" if median is None else median,
                         "", "", "", ""])
            for at, gap, before, after in v["median_step_gaps"]:
                rows.append(["", "", "", f"{at:.1f}", f"{gap:.1f}", before[-60:], after[-60:]])
        out.append(f"P={t['stages']} M={t['microbatches']} timeline: "
                   f"{len(summary['steps'])} whole steps traced, median "
                   f"{summary['median_step_ms'] or 0:.1f} ms; GPipe's ideal busy share "
                   f"M/(M+P-1) = {t['ideal_busy']:.3f}; the median step's longest gaps\n" +
                   format_table(["task", "busy (window)", "busy (median step)", "gap at ms",
                                 "gap ms", "op before", "op after"], rows))
    if "schedules" in result:
        out.append(pipeline_schedules.table(result))
    if "versus" in result:
        out.append(pipeline_versus.table(result))
    return "\n\n".join(out)


def plot(result, fig):
    """Memory fractions, step times against the ideal, and GPipe vs 1F1B peaks."""
    parts = [p for p in PARTS if p in result and p != "timeline"] or ["timeline"]
    fig.set_size_inches(5 * len(parts) + (4 if "memory" in parts else 0), 5)
    axes = fig.subplots(1, len(parts), squeeze=False, gridspec_kw={
        "width_ratios": [2 if p == "memory" else 1 for p in parts]})[0]
    for ax, part in zip(axes, parts):
        if part == "memory":
            labels, train, whole = [], [], []
            for r in result["memory"]["runs"]:
                for proc in r["processes"]:
                    labels.append(f"P{r['stages']} M{r['microbatches']}\nt{proc['task']}")
                    train.append(proc.get("train_fraction", 0.0))
                    whole.append(proc.get("run_fraction", 0.0))
            x = range(len(labels))
            ax.bar([i - 0.2 for i in x], train, 0.4, label="to the last step")
            ax.bar([i + 0.2 for i in x], whole, 0.4, label="whole run (backup, save)")
            ax.axhline(result["memory"]["target_fraction"], color="k", ls="--", lw=1,
                       label="target 0.65")
            ax.set_xticks(list(x), labels, fontsize=6)
            ax.set_ylabel("peak RSS / one process's")
            ax.set_title("per-process peak memory", fontsize=9)
            ax.legend(fontsize=6)
        elif part == "time":
            t = result["time"]
            rows = [point["microbatch_rows"] for point in t["points"]]
            for key, label in (("one_process_step_s", "1 proc, 1 core"),
                               ("stages_step_s", f"{t['stages']} procs, pinned")):
                ax.plot(rows, [point[key] * 1e3 for point in t["points"]], "o-", label=label)
            ax.plot(rows, [point["one_process_step_s"] * t["ideal_ratio"] * 1e3
                           for point in t["points"]], "k--", lw=1, label="GPipe ideal")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("rows per micro-batch")
            ax.set_ylabel("step ms")
            ax.set_title(f"M={t['microbatches']}: " + ", ".join(
                f"{point['vs_ideal']:.2f}x" for point in t["points"]) + " the ideal", fontsize=9)
            ax.legend(fontsize=6)
        elif part == "schedules":
            pipeline_schedules.plot(result, ax)
        elif part == "versus":
            pipeline_versus.plot(result, ax)
        elif part == "chief":
            chief_peak.plot(result["chief"], ax)
        elif part == "timeline":
            if "timeline" not in result:
                continue
            t = result["timeline"]
            tasks = list(t["summary"]["tasks"].items())
            ax.bar([f"task {k}" for k, _ in tasks],
                   [v["window_busy"] if v["median_step_busy"] is None else v["median_step_busy"]
                    for _, v in tasks])
            ax.axhline(t["ideal_busy"], color="k", ls="--", lw=1, label="GPipe's ideal")
            ax.set_ylabel("busy share of a step")
            ax.set_title(f"timeline, P={t['stages']} M={t['microbatches']}", fontsize=9)
            ax.legend(fontsize=6)
        else:
            s = result["schedule"]
            names = list(s["runs"])
            tasks = [proc["task"] for proc in s["runs"][names[0]]["processes"]]
            for k, name in enumerate(names):
                peaks = [_mib(proc["train_peak_bytes"]) for proc in s["runs"][name]["processes"]]
                ax.bar([t + (k - 0.5) * 0.4 for t in tasks], peaks, 0.4, label=name)
            ax.set_xticks(tasks, [f"task {t}" for t in tasks])
            ax.set_ylabel("train peak MiB")
            ax.set_title(f"GPipe vs 1F1B, P={s['stages']} M={s['microbatches']}", fontsize=9)
            ax.legend(fontsize=6)
