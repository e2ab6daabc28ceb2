"""`pipeline-processes --parts schedules`: 1F1B against interleaved 1F1B and zero bubble (#42).

P stage processes, each pinned to its own core (`tfdist.launch --cpu-bind
cores`), M micro-batches of `--schedules-rows` rows, the schedules of
`--schedules` run in turns (the order reversed every other repeat, so a
slow spell of the shared machine falls on each). Every run is traced by
TensorFlow's profiler for `--timeline-ms` after its warm-up
(`tfdist.bench.timeline`).

- measured bubble: 1 - each task's busy share of the median traced step
  (the time its ops ran), averaged over the tasks; the idle share of each
  task's CPU time over the timed steps (`memory.between`) is beside it.
- predicted: each schedule's formula (`simulate.formula`), and the step it
  predicts from 1F1B's measured step: (1 - bubble_1f1b) / (1 - bubble) of it.
- the issue's bar: a schedule saves at least half of its predicted saving
  on 1F1B's step, and its measured bubble is below 1F1B's.
- the planner's prediction (`tfdist.bench.plan_worker`, before each repeat, on
  the core a stage gets): each layer measured on one micro-batch, and the fixed cost of
  an action, each schedule run on paper with `--hop-ms` a hand-off; its step against the
  measured one, and each task's predicted peak (a fresh TensorFlow process's RSS, then
  weights, gradients, Adam's slots, activations in flight) against its peak RSS.
"""

from __future__ import annotations

import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile

SCHEDULES = "1f1b,interleaved,zb"


def add_arguments(parser) -> None:
    """Flags of the schedules part."""
    parser.add_argument("--schedules", default=SCHEDULES,
                        help=f"schedules part: comma-separated (default {SCHEDULES}; 1f1b "
                             "first: the others are compared with it)")
    parser.add_argument("--schedules-microbatches", type=int, default=4,
                        help="schedules part: M")
    parser.add_argument("--schedules-rows", type=int, default=64,
                        help="schedules part: rows a micro-batch")
    parser.add_argument("--virtual-stages", type=int, default=2,
                        help="schedules part: V of the interleaved schedule")
    parser.add_argument("--hop-ms", type=float, default=1.0,
                        help="schedules part: the planner's cost of one hand-off between "
                             "stage processes (docs/model_parallel.md: about 1 ms)")


def predicted_ratio(name: str, stages: int, microbatches: int, virtual: int) -> float:
    """Pure function: the step of `name` over 1F1B's when both do the same work a stage.

    A step is a stage's work over its busy share, W / (1 - bubble).
    """
    from tfdist.model_parallel.planning import simulate

    v = virtual if name == "interleaved" else 1
    return ((1 - simulate.formula("1f1b", stages, microbatches)) /
            (1 - simulate.formula(name, stages, microbatches, v)))


def measured_bubble(summary: dict) -> float:
    """Pure function: 1 - the tasks' mean busy share of the median traced step
    (`timeline.summarize`'s)."""
    busy = [v["median_step_busy"] for v in summary["tasks"].values()
            if v["median_step_busy"] is not None]
    if not busy:
        raise ValueError("The trace holds no whole step: trace longer (--timeline-ms) or "
                         "run more steps (--time-steps).")
    return 1.0 - statistics.mean(busy)


def _trace(logdir: str) -> dict:
    from tfdist.bench import timeline

    return timeline.summarize(*timeline.read(logdir))


def plan(args) -> dict:
    """The planner's predictions for the time model (`plan_worker`, on stage 0's core).

    Raises:
        RuntimeError: when the worker fails, with its output's tail.
    """
    from tfdist.bench import runs

    p, m = args.time_stages, args.schedules_microbatches
    cmd = [sys.executable, "-m", "tfdist.bench.bind", "--share", f"0/{p}", "--",
           sys.executable, "-m", "tfdist.bench.plan_worker", str(args.schedules_rows), str(p),
           str(m), str(args.virtual_stages), f"{args.hop_ms:g}", *shlex.split(args.time_model),
           "--seed", "0"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=runs.REPO,
                          env=runs.child_env({}), timeout=args.timeout)
    found = runs.parse(proc.stdout)
    if proc.returncode or not found:
        raise RuntimeError(f"planner failed (rc={proc.returncode}): {shlex.join(cmd)}\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return found[0]


def _one_run(staged: dict, summary: dict, planner_step_s) -> dict:
    """One schedule's run: its wall-clock step beside its traced step, bubble and memory."""
    cpu = [proc["cpu_share"] for proc in staged["processes"] if proc["cpu_share"] is not None]
    return {
        "step_s": staged["median_step_s"], "traced_step_ms": summary["median_step_ms"],
        "busy": [v["median_step_busy"] for v in summary["tasks"].values()],
        "bubble": measured_bubble(summary),
        "cpu_bubble": 1 - statistics.mean(cpu) if cpu else None,
        "cpu_shares": cpu, "load_avg_1m": staged["load_avg_1m"],
        "peak_bytes": [proc["train_peak_bytes"] for proc in staged["processes"]],
        "final_loss": staged["final_loss"], "planner_step_s": planner_step_s}


def measure(args, run_job, planned=None, trace=_trace) -> dict:
    """Runs the part. `run_job(argv, tasks, timeout, interval, bind=, warmup=, env=)` runs
    one job (`pipeline_processes._run`); `trace(logdir)` summarizes its trace.

    The planner's pass runs once a repeat, just before that repeat's runs (the
    shared machine's load moves over a part, and a layer pass timed at another
    moment than the steps it predicts measures the load, not the planner);
    `planned`, when given, stands for every repeat's."""
    from tfdist.bench import timeline
    from tfdist.model_parallel.planning import simulate

    names = [n.strip() for n in args.schedules.split(",") if n.strip()]
    if names[0] != "1f1b":
        raise ValueError(f"--schedules must start with 1f1b (the others are compared with "
                         f"it). Received: {args.schedules!r}.")
    p, m, v = args.time_stages, args.schedules_microbatches, args.virtual_stages
    batch = args.schedules_rows * m
    base = [*args.time_model.split(), "--epochs", "1", "--verbose", "0", "--seed", "0",
            "--learning-rate", "0.001", "--steps-per-epoch", str(args.time_steps),
            "--global-batch-size", str(batch), "--threads", "1", "--microbatches", str(m),
            "--strategy", "pipeline"]
    plans = []
    per = {name: [] for name in names}
    for r in range(args.repeats):
        plans.append(plan(args) if planned is None else planned)
        for name in (names if r % 2 == 0 else names[::-1]):
            print(f"pipeline-processes: schedules {name}, repeat {r + 1}/{args.repeats}",
                  file=sys.stderr, flush=True)
            extra = ["--schedule", name] + (["--virtual-stages", str(v)]
                                            if name == "interleaved" else [])
            logdir = tempfile.mkdtemp(prefix="tfdist-bench-schedules-")
            try:
                staged = run_job([*base, *extra, "--devices", "0"], p, args.timeout,
                                 args.interval, bind="cores", warmup=args.warmup,
                                 env={timeline.ENV: f"{args.warmup + 2},{args.timeline_ms},"
                                                    f"{logdir}"})
                summary = trace(logdir)
            finally:
                shutil.rmtree(logdir, ignore_errors=True)
            per[name].append(_one_run(staged, summary,
                                      plans[-1]["predictions"].get(name, {}).get("step_s")))
    out = {}
    for name in names:
        runs_ = per[name]
        step = statistics.median(x["step_s"] for x in runs_)
        vs = statistics.median(x["step_s"] / y["step_s"] for x, y in zip(runs_, per["1f1b"]))
        ratio = predicted_ratio(name, p, m, v)
        out[name] = {
            "runs": runs_, "step_s": step, "vs_1f1b": vs, "predicted_vs_1f1b": ratio,
            "bubble": statistics.median(x["bubble"] for x in runs_),
            "cpu_bubble": statistics.median(x["cpu_bubble"] for x in runs_
                                            if x["cpu_bubble"] is not None)
            if any(x["cpu_bubble"] is not None for x in runs_) else None,
            "predicted_bubble": simulate.formula(name, p, m, v if name == "interleaved" else 1),
            "predicted_step_s": ratio * statistics.median(x["step_s"] for x in per["1f1b"]),
            # The bar: at least half the predicted saving, and a bubble below 1F1B's.
            "saves_half": name == "1f1b" or (1 - vs) >= (1 - ratio) / 2}
        guess = plans[0]["predictions"].get(name)
        if guess:
            rss = [statistics.median(x["peak_bytes"][t] for x in runs_) for t in range(p)]
            out[name].update({
                "planner_step_s": statistics.median(x["planner_step_s"] for x in runs_),
                "planner_bubble": guess["bubble"],
                # Each repeat's plan against the same repeat's step, the median kept.
                "planner_vs_measured": statistics.median(x["planner_step_s"] / x["step_s"]
                                                         for x in runs_),
                "planner_peak_bytes": guess["peak_bytes"], "peak_rss_bytes": rss,
                # The bar: each task's predicted peak within 15% of its peak RSS.
                "planner_peak_vs_rss": [a / b if b else None
                                        for a, b in zip(guess["peak_bytes"], rss)]})
    for name in names:
        out[name]["bubble_below_1f1b"] = (name == "1f1b" or
                                          out[name]["bubble"] < out["1f1b"]["bubble"])
    return {"model": args.time_model, "stages": p, "microbatches": m, "virtual_stages": v,
            "microbatch_rows": args.schedules_rows, "steps": args.time_steps,
            "repeats": args.repeats, "schedules": out, "planner": plans[0], "plans": plans}


def table(result) -> str:
    """One row a schedule and repeat, then its medians against the prediction."""
    from tfdist.bench.report import format_table

    s = result["schedules"]
    rows = []
    for name, point in s["schedules"].items():
        for i, x in enumerate(point["runs"]):
            rows.append([name, i, x["step_s"] * 1e3, x["traced_step_ms"], "",
                         x["bubble"], "" if x["cpu_bubble"] is None else x["cpu_bubble"], "",
                         x["load_avg_1m"]])
        rows.append([name, "median", point["step_s"] * 1e3, "", point["vs_1f1b"],
                     point["bubble"], "" if point["cpu_bubble"] is None else point["cpu_bubble"],
                     f"{point['predicted_vs_1f1b']:.3f} / {point['predicted_bubble']:.3f}", ""])
    planned = [[name, point["planner_step_s"] * 1e3, point["step_s"] * 1e3,
                point["planner_vs_measured"], point["planner_bubble"],
                "/".join(f"{b / 2**20:.0f}" for b in point["planner_peak_bytes"]),
                "/".join(f"{b / 2**20:.0f}" for b in point["peak_rss_bytes"]),
                "/".join("-" if r is None else f"{r:.3f}" for r in point["planner_peak_vs_rss"])]
               for name, point in s["schedules"].items() if "planner_step_s" in point]
    # The fixed cost each action was planned with, per repeat (`profile.action_s`).
    actions = [p["action_s"] for p in s.get("plans", []) if p.get("action_s") is not None]
    fixed = (f"; each action + {'/'.join(f'{a * 1e6:.2g}' for a in actions)} µs fixed, per "
             "repeat" if actions else "")
    return (f"P={s['stages']} M={s['microbatches']} V={s['virtual_stages']}, "
            f"{s['microbatch_rows']} rows a micro-batch, each stage pinned to a core; "
            "bubble = 1 - the tasks' busy share of the median traced step\n" +
            format_table(["schedule", "repeat", "step ms", "traced ms", "/ 1f1b", "bubble",
                          "CPU bubble", "predicted / 1f1b, bubble", "load"], rows) +
            "\nplanner (layers measured on one micro-batch before each repeat; planned / "
            "measured: the median of each repeat's; peak = a fresh TensorFlow process's RSS + "
            "weights, gradients, Adam slots, activations in flight, per task" + fixed + ")\n" +
            format_table(["schedule", "planned ms", "measured ms", "planned / measured",
                          "planned bubble", "planned peak MiB", "peak RSS MiB",
                          "planned / RSS"], planned))


def plot(result, ax) -> None:
    """Measured and predicted step (relative to 1F1B) and bubble, a bar each."""
    s = result["schedules"]
    names = list(s["schedules"])
    x = range(len(names))
    points = [s["schedules"][n] for n in names]
    ax.bar([i - 0.3 for i in x], [p["vs_1f1b"] for p in points], 0.2, label="step / 1F1B's")
    ax.bar([i - 0.1 for i in x], [p["predicted_vs_1f1b"] for p in points], 0.2,
           label="predicted")
    ax.bar([i + 0.1 for i in x], [p["bubble"] for p in points], 0.2, label="bubble")
    ax.bar([i + 0.3 for i in x], [p["predicted_bubble"] for p in points], 0.2,
           label="formula's bubble")
    ax.set_xticks(list(x), names)
    ax.set_title(f"P={s['stages']} M={s['microbatches']}, {s['microbatch_rows']} rows, pinned",
                 fontsize=9)
    ax.legend(fontsize=6)
