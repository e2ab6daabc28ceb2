"""`python -m tfdist.bench overhead`: tfdist's trainer vs the same engine driven by hand.

For each engine (`--engines`: multi_worker, horovod, shm; `single` with
`-n 1`) the same recipe, global batch and optimizer run through
`tfdist.train`'s trainer and through `tfdist.bench.raw_keras` (the engine's
own API and Keras `fit`, no trainer). The ratio is tfdist/raw examples/s.

`--compare segments` (the default): each round is one set of worker
processes in which tfdist and raw take turns every `--segment-steps` steps
(`tfdist.bench.paired_worker`), so whatever slows a process or a few seconds
of the machine slows both. `--compare runs`: tfdist and raw each run in
their own processes, `--steps` steps, interleaved (tfdist first in odd
rounds, raw first in even ones). The noise is between processes (per-round
tfdist/raw 0.88-1.12 in separate runs, 0.97-1.00 taking turns, on 2 shared
cores), so only segments resolve the 2% the goal asks.

Each round gives one ratio per engine; the reported ratio is their mean with
a 95% t interval. After `--rounds` rounds, more are added for the engines
whose interval is still wider than `--ci-width`, until `--max-rounds` or
`--max-minutes`. The goal (ratio >= 0.98) is "met" when the whole interval
lies above it, "not met" when below, else "undecided".

`--cpu-bind cores` binds each worker to its own share of the cores.
`--variants` adds tfdist runs (with segments: paired runs, each against
its own raw side) with per-step machinery switched off, to attribute a gap:
`--preempt-check-steps` large (the periodic SIGTERM agreement, a one-scalar
all-reduce across workers) and `--csv-log false`. With segments, the variant
`raw_vs_raw` is the A/A control: raw's `fit` on both threads of a paired run,
so its ratio is the benchmark's own bias, against which tfdist/raw is read.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from tfdist.bench import runs, stats

DESCRIPTION = "throughput of tfdist.train vs the same engine driven by hand (ratio = tfdist/raw)"
GOAL_RATIO = 0.98
ENGINES = ("multi_worker", "horovod", "shm")
COMPARE = ("segments", "runs")
# name -> extra tfdist.train flags; each isolates one per-step cost of the trainer.
# The A/A control (--compare segments): raw on both sides of a paired run, so its
# ratio is the benchmark's own bias (the main thread and first turn against the others).
CONTROL = "raw_vs_raw"
VARIANTS = {"no_preempt_agreement": ["--preempt-check-steps", "1000000"],
            "no_csv_log": ["--csv-log", "false"],
            CONTROL: []}


def add_arguments(parser) -> None:
    """Flags of this benchmark."""
    parser.add_argument("--recipe", default="synthetic_cnn")
    parser.add_argument("-n", "--workers", type=int, default=2,
                        help="1: one process (engine single); >1: the --engines")
    parser.add_argument("--engines", default="",
                        help=f"comma-separated, from {list(ENGINES)} (default: all three with "
                             "-n >= 2, horovod only when its venv exists; single with -n 1)")
    parser.add_argument("--global-batch-size", type=int, default=64)
    parser.add_argument("--compare", choices=COMPARE, default="segments",
                        help="segments: tfdist and raw alternate in the same worker processes "
                             "(tfdist.bench.paired_worker); runs: each in its own processes")
    parser.add_argument("--segment-steps", type=int, default=4,
                        help="--compare segments: steps of each side before the other's turn")
    parser.add_argument("--segments", type=int, default=40,
                        help="--compare segments: counted segments of each side per round, "
                             "after the segments that hold the --warmup steps")
    parser.add_argument("--steps", type=int, default=60, help="--compare runs: steps per run")
    parser.add_argument("--warmup", type=int, default=5,
                        help="steps not timed at the start of each run (--compare segments: "
                             "whole segments, at least one)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds every engine runs (>= 2)")
    parser.add_argument("--max-rounds", type=int, default=30,
                        help="rounds at most, for an engine whose interval is still too wide")
    parser.add_argument("--ci-width", type=float, default=0.02,
                        help="stop adding rounds to an engine once its 95%% interval is narrower")
    parser.add_argument("--max-minutes", type=float, default=90.0,
                        help="start no new round after this long")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cpu-bind", choices=runs.CPU_BIND, default="none",
                        help="cores: each worker, tfdist's and raw's alike, on its own share of "
                             "the cores (tfdist.launch --cpu-bind cores; tfdist.bench.bind under "
                             "horovodrun). Measured: no narrower per-round spread than none")
    parser.add_argument("--variants", default="",
                        help=f"comma-separated, from {sorted(VARIANTS)}; '' for none")
    parser.add_argument("--controller", default="gloo", choices=("gloo", "mpi"),
                        help="horovodrun controller for the horovod engine")
    parser.add_argument("--venv", default=None, help="Horovod venv (default: as scaling)")
    parser.add_argument("--timeout", type=float, default=400.0)


def engines_for(args) -> list[str]:
    """The engines to measure, checked; exits with one line on a bad choice."""
    if args.workers < 1:
        raise SystemExit(f"error: --workers must be >= 1. Received: {args.workers}.")
    if args.workers == 1:
        if args.engines not in ("", "single"):
            raise SystemExit(f"error: -n 1 measures the engine single only. Received: "
                             f"--engines {args.engines}.")
        return ["single"]
    if not args.engines:
        return [e for e in ENGINES if e != "horovod" or runs.horovod_venv(args.venv)]
    engines = [e for e in args.engines.split(",") if e]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown or not engines:
        raise SystemExit(f"error: --engines takes {list(ENGINES)}. Received: {args.engines!r}.")
    if "horovod" in engines and not runs.horovod_venv(args.venv):
        raise SystemExit("error: --engines horovod needs the Horovod venv. "
                         "HINT: run scripts/install_horovod.sh")
    return engines


def _launch(args, engine: str, module: str, flags: list[str]) -> list[str]:
    if engine == "horovod":
        return runs.horovod_command(runs.horovod_venv(args.venv), args.workers, args.controller,
                                    module, flags, cpu_bind=args.cpu_bind)
    return runs.launch_command(args.workers, module, flags, args.timeout, args.cpu_bind)


def _train_flags(args, engine: str, model_dir: str, steps: int, extra: list[str]) -> list[str]:
    """`tfdist.train` arguments of one tfdist run: one epoch of `steps` steps, from scratch."""
    return [args.recipe, "--strategy", engine,
            "--global-batch-size", str(args.global_batch_size), "--epochs", "1",
            "--steps-per-epoch", str(steps), "--threads", str(args.threads),
            "--verbose", "0", "--model-dir", model_dir, "--resume", "false", *extra]


def _tfdist_cmd(args, engine: str, model_dir: str, extra: list[str]) -> list[str]:
    return _launch(args, engine, "tfdist.bench.train_worker",
                   _train_flags(args, engine, model_dir, args.steps, extra))


def warmup_segments(warmup_steps: int, segment_steps: int) -> int:
    """Pure function: segments of each side not timed, so that >= `warmup_steps` steps are not."""
    return max(1, -(-warmup_steps // segment_steps))


def _paired_cmd(args, engine: str, model_dir: str, extra: list[str],
                control: bool = False) -> list[str]:
    warmup = warmup_segments(args.warmup, args.segment_steps)
    steps = (args.segments + warmup) * args.segment_steps
    spec = {"recipe": args.recipe, "global_batch_size": args.global_batch_size,
            "segment_steps": args.segment_steps, "warmup_segments": warmup,
            "threads": args.threads, "control": control}
    return _launch(args, engine, "tfdist.bench.paired_worker",
                   [json.dumps(spec), *_train_flags(args, engine, model_dir, steps, extra)])


def _raw_cmd(args, engine: str) -> list[str]:
    spec = {"recipe": args.recipe, "global_batch_size": args.global_batch_size,
            "steps": args.steps, "warmup": args.warmup, "threads": args.threads,
            "engine": engine}
    return _launch(args, engine, "tfdist.bench.raw_keras", [json.dumps(spec)])


def summarize(tfdist: list[float], raw: list[float], goal: float = GOAL_RATIO) -> dict:
    """Pure function: per-round ratios, their mean, 95% interval and the verdict.

    Args:
        tfdist: examples/s of the tfdist runs, one per round.
        raw: examples/s of the raw runs of the same rounds.
        goal: The ratio to reach.
    """
    ratios = [t / r for t, r in zip(tfdist, raw)]
    mean, low, high = stats.mean_ci95(ratios)
    return {"ratios": ratios, "ratio": mean, "ci95": [low, high], "ci_width": high - low,
            "ratio_of_medians": statistics.median(tfdist) / statistics.median(raw),
            "verdict": stats.verdict(low, high, goal)}


def progress(done: int, per: dict, engines: list[str], width: float) -> str:
    """Pure function: the line printed after `done` rounds: each engine's ratio so far.

    A run can take most of an hour; this says where each engine stands.
    """
    parts = []
    for e in engines:
        xs = per[e]["examples_per_s"]
        if len(xs["raw"]) >= 2:
            s = summarize(xs["tfdist"], xs["raw"])
            state = "resolved" if s["ci_width"] < width else f"width {s['ci_width']:.3f}"
            parts.append(f"{e} {s['ratio']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}] "
                         f"({len(xs['raw'])} rounds, {state})")
        elif xs["raw"]:
            parts.append(f"{e} {xs['tfdist'][0] / xs['raw'][0]:.3f} (1 round)")
    return f"overhead: after round {done}: " + "; ".join(parts)


def _check(args, variants: list[str]) -> None:
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"error: unknown variants {unknown}; valid: {sorted(VARIANTS)}")
    if CONTROL in variants and args.compare != "segments":
        raise SystemExit(f"error: the variant {CONTROL} (raw on both sides of a paired run) "
                         f"needs --compare segments. Received: --compare {args.compare}.")
    if args.compare == "segments" and (args.segment_steps < 2 or args.segments < 1):
        raise SystemExit("error: --compare segments needs --segment-steps >= 2 (a one-step turn "
                         "would time mostly the hand-over) and --segments >= 1. Received: "
                         f"--segment-steps {args.segment_steps} --segments {args.segments}.")
    if args.rounds < 2 or args.max_rounds < args.rounds:
        raise SystemExit("error: an interval needs --rounds >= 2 and --max-rounds >= --rounds. "
                         f"Received: --rounds {args.rounds} --max-rounds {args.max_rounds}.")


def _one_round(args, engine: str, r: int, names: list[str], env: dict):
    """({name: examples/s}, {variant: its tfdist/raw}, per-segment step times or {}).

    With segments each variant is a paired run of its own, its ratio against
    the raw side of that run; with runs, against the round's raw run.
    """
    keep = getattr(args, "keep_runs", False)
    if args.compare == "segments":
        xs, ratios, segments = {}, {}, {}
        for name in [n for n in names if n != "raw"]:
            with runs.model_dir(args.out, f"{engine}_{name}_{r}", keep) as model_dir:
                result = runs.run(_paired_cmd(args, engine, model_dir, VARIANTS.get(name, []),
                                              control=name == CONTROL),
                                  args.timeout + 60, env,
                                  what=f"overhead {engine} {name} round {r}")[0]
            pair = result["examples_per_s"]
            if name == "tfdist":
                xs.update(pair)
                segments = {k: result[k] for k in ("tfdist_step_s", "raw_step_s")}
            else:
                xs[name], ratios[name] = pair["tfdist"], pair["tfdist"] / pair["raw"]
        return xs, ratios, segments
    # Alternate which runs first, so that a drift within a round favours neither.
    xs = {}
    for name in (names if r % 2 == 0 else names[::-1]):
        with runs.model_dir(args.out, f"{engine}_{name}_{r}", keep) as model_dir:
            cmd = (_raw_cmd(args, engine) if name == "raw" else
                   _tfdist_cmd(args, engine, model_dir, VARIANTS.get(name, [])))
            xs[name] = runs.run(cmd, args.timeout + 60, env,
                                what=f"overhead {engine} {name} round {r}")[0]["examples_per_s"]
    return xs, {n: xs[n] / xs["raw"] for n in names[2:]}, {}


def run(args) -> dict:
    """Interleaved rounds of every engine's tfdist and raw runs; returns ratios with intervals."""
    variants = [v for v in args.variants.split(",") if v]
    _check(args, variants)
    engines = engines_for(args)
    env = {"TFDIST_BENCH_WARMUP_STEPS": str(args.warmup)}
    names = ["tfdist", "raw", *variants]
    per = {e: {"examples_per_s": {n: [] for n in names}, "load_avg_1m": [], "segments": [],
               "variant_ratios": {v: [] for v in variants}} for e in engines}
    start = time.monotonic()
    active, r = list(engines), 0
    while active and r < args.max_rounds:
        if r >= args.rounds and time.monotonic() - start > args.max_minutes * 60:
            break
        for engine in active:
            per[engine]["load_avg_1m"].append(runs.load_average())
            xs, ratios, segments = _one_round(args, engine, r, names, env)
            for name in names:
                per[engine]["examples_per_s"][name].append(xs[name])
            for name, ratio in ratios.items():
                per[engine]["variant_ratios"][name].append(ratio)
            if segments:
                per[engine]["segments"].append(segments)
        r += 1
        print(progress(r, per, engines, args.ci_width), file=sys.stderr, flush=True)
        if r >= args.rounds:
            active = [e for e in active if summarize(
                per[e]["examples_per_s"]["tfdist"],
                per[e]["examples_per_s"]["raw"])["ci_width"] >= args.ci_width]
    results = {}
    for engine in engines:
        xs = per[engine]["examples_per_s"]
        results[engine] = {
            **summarize(xs["tfdist"], xs["raw"]), "rounds": len(xs["raw"]),
            "examples_per_s": xs,
            "median_examples_per_s": {n: statistics.median(v) for n, v in xs.items()},
            "variant_ratios": {v: statistics.fmean(per[engine]["variant_ratios"][v])
                               for v in variants},
            "variant_ratios_per_round": per[engine]["variant_ratios"],
            "load_avg_1m": per[engine]["load_avg_1m"],
            "segment_step_s": per[engine]["segments"],
            "resolved": summarize(xs["tfdist"], xs["raw"])["ci_width"] < args.ci_width}
    head = results[engines[0]]
    return {"recipe": args.recipe, "workers": args.workers, "engines": engines,
            "global_batch_size": args.global_batch_size, "steps": args.steps,
            "warmup_steps": args.warmup, "min_rounds": args.rounds,
            "max_rounds": args.max_rounds, "target_ci_width": args.ci_width,
            "threads": args.threads, "cpu_bind": args.cpu_bind, "compare": args.compare,
            "segment_steps": args.segment_steps, "segments": args.segments, "results": results,
            "ratio": head["ratio"], "ci95": head["ci95"], "goal_ratio": GOAL_RATIO,
            "elapsed_s": time.monotonic() - start,
            "load_avg_1m": {"min": min(min(v["load_avg_1m"]) for v in results.values()),
                            "max": max(max(v["load_avg_1m"]) for v in results.values())},
            "note": "ratio = mean over rounds of tfdist/raw examples/s, 95% t interval; " + (
                "each round one set of worker processes alternating segments of "
                f"{args.segment_steps} tfdist and raw steps (the first "
                f"{warmup_segments(args.warmup, args.segment_steps)} of each side not timed)"
                if args.compare == "segments" else
                "steady state after the warm-up steps; runs interleaved " + " / ".join(names))}


def table(result: dict) -> str:
    """One row per engine and configuration, then each engine's verdict."""
    from tfdist.bench.report import format_table

    rows, lines = [], []
    for engine, r in result["results"].items():
        raw = r["median_examples_per_s"]["raw"]
        for name, xs in r["examples_per_s"].items():
            rows.append([engine, name, " ".join(f"{x:.0f}" for x in xs),
                         r["median_examples_per_s"][name], r["median_examples_per_s"][name] / raw])
        lo, hi = r["ci95"]
        load = r["load_avg_1m"]
        lines.append(f"{engine}: tfdist/raw = {r['ratio']:.3f}, 95% CI [{lo:.3f}, {hi:.3f}] "
                     f"(width {r['ci_width']:.3f}, {r['rounds']} rounds); goal >= "
                     f"{result['goal_ratio']}: {r['verdict']}; load 1m {min(load):.2f}-"
                     f"{max(load):.2f}" + "".join(f"; {v} {x:.3f}" for v, x in
                                                   r["variant_ratios"].items()))
    out = format_table(["engine", "run", "examples/s per round", "median", "vs raw"], rows)
    return out + "\n" + "\n".join(lines)


def plot(result: dict, fig) -> None:
    """Left: per-round ratios per engine, with mean and 95% interval. Right: examples/s per round."""
    from matplotlib.ticker import MaxNLocator

    left, right = fig.subplots(1, 2)
    engines = list(result["results"])
    for i, engine in enumerate(engines):
        r = result["results"][engine]
        n = len(r["ratios"])
        # Deterministic jitter, so rounds do not hide behind each other.
        xs = [i + 0.25 * ((k / max(1, n - 1)) - 0.5) for k in range(n)]
        left.plot(xs, r["ratios"], "o", alpha=0.5, color=f"C{i}")
        lo, hi = r["ci95"]
        left.errorbar([i + 0.35], [r["ratio"]], yerr=[[r["ratio"] - lo], [hi - r["ratio"]]],
                      fmt="D", color="black", capsize=4)
        left.annotate(f"{r['ratio']:.3f}\n[{lo:.3f}, {hi:.3f}]", (i + 0.4, r["ratio"]),
                      fontsize=7, va="center")
        for name, marker in (("tfdist", "o"), ("raw", "x")):
            ys = r["examples_per_s"][name]
            right.plot(range(1, len(ys) + 1), ys, marker, color=f"C{i}",
                       label=f"{engine} {name}")
    left.axhline(result["goal_ratio"], color="grey", linestyle=":",
                 label=f"goal {result['goal_ratio']}")
    left.set_xticks(range(len(engines)), engines)
    left.set_xlim(-0.5, len(engines) - 0.2)
    left.set_ylabel("tfdist / raw per round (mean, 95% CI)")
    left.set_title(f"{result['recipe']}, {result['workers']} worker(s), "
                   f"cpu-bind {result.get('cpu_bind', 'none')}")
    left.legend(fontsize=7)
    right.xaxis.set_major_locator(MaxNLocator(integer=True))
    right.set_xlabel("round")
    right.set_ylabel("examples/s")
    right.legend(fontsize=7)
