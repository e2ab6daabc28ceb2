"""`python -m tfdist.bench overhead`: tfdist's trainer vs the same job hand-written on raw Keras.

The same recipe, global batch, optimizer and step count, run alternately
(`--rounds` times each, interleaved so that load drifts hit both alike)
through `tfdist.train`'s trainer (`tfdist.bench.train_worker`) and through
`tfdist.bench.raw_keras`. Both time steps with the same callback and skip the
same warm-up steps. ratio = median tfdist examples/s / median raw examples/s.

`--variants` adds tfdist runs with per-step machinery switched off, to
attribute any gap: `--preempt-check-steps` large (the per-step SIGTERM
agreement, a one-scalar all-reduce across workers) and `--csv-log false`.
"""

from __future__ import annotations

import json
import os
import statistics

from tfdist.bench import runs

DESCRIPTION = "throughput of tfdist.train vs hand-written tf.distribute + Keras (ratio = tfdist/raw)"
GOAL_RATIO = 0.98
# name -> extra tfdist.train flags; each isolates one per-step cost of the trainer.
VARIANTS = {"no_preempt_agreement": ["--preempt-check-steps", "1000000"],
            "no_csv_log": ["--csv-log", "false"]}


def add_arguments(parser) -> None:
    """Flags of this benchmark."""
    parser.add_argument("--recipe", default="synthetic_cnn")
    parser.add_argument("-n", "--workers", type=int, default=2,
                        help="1: one process (default strategy); >1: multi_worker via tfdist.launch")
    parser.add_argument("--global-batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--variants", default="no_preempt_agreement",
                        help=f"comma-separated, from {sorted(VARIANTS)}; '' for none")
    parser.add_argument("--timeout", type=float, default=400.0)


def _tfdist_cmd(args, model_dir: str, extra: list[str]) -> list[str]:
    flags = [args.recipe, "--strategy", "multi_worker" if args.workers > 1 else "single",
             "--global-batch-size", str(args.global_batch_size), "--epochs", "1",
             "--steps-per-epoch", str(args.steps), "--threads", str(args.threads),
             "--verbose", "0", "--model-dir", model_dir, "--resume", "false", *extra]
    return runs.launch_command(args.workers, "tfdist.bench.train_worker", flags, args.timeout)


def _raw_cmd(args) -> list[str]:
    spec = {"recipe": args.recipe, "global_batch_size": args.global_batch_size,
            "steps": args.steps, "warmup": args.warmup, "threads": args.threads}
    return runs.launch_command(args.workers, "tfdist.bench.raw_keras", [json.dumps(spec)],
                               args.timeout)


def run(args) -> dict:
    """Alternates tfdist, raw and each variant for `rounds` rounds; returns the ratios."""
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"error: unknown variants {unknown}; valid: {sorted(VARIANTS)}")
    env = {"TFDIST_BENCH_WARMUP_STEPS": str(args.warmup)}
    names = ["tfdist", "raw", *variants]
    samples = {n: [] for n in names}
    loads = []
    for r in range(args.rounds):
        for name in names:
            model_dir = os.path.join(os.path.abspath(args.out), "runs", f"{name}_{r}")
            cmd = (_raw_cmd(args) if name == "raw" else
                   _tfdist_cmd(args, model_dir, VARIANTS.get(name, [])))
            loads.append(runs.load_average())
            samples[name].append(runs.run(cmd, args.timeout + 60, env,
                                          what=f"overhead {name} round {r}")[0]["examples_per_s"])
    median = {n: statistics.median(v) for n, v in samples.items()}
    ratio = median["tfdist"] / median["raw"]
    return {"recipe": args.recipe, "workers": args.workers,
            "global_batch_size": args.global_batch_size, "steps": args.steps,
            "warmup_steps": args.warmup, "rounds": args.rounds, "threads": args.threads,
            "examples_per_s": samples, "median_examples_per_s": median,
            "ratio": ratio, "goal_ratio": GOAL_RATIO, "goal_met": ratio >= GOAL_RATIO,
            "variant_ratios": {v: median[v] / median["raw"] for v in variants},
            "load_avg_1m": {"min": min(loads), "max": max(loads)},
            "note": "steady-state examples/s (after warm-up), runs interleaved "
                    + " / ".join(names)}


def table(result: dict) -> str:
    """One row per configuration, then the verdict."""
    from tfdist.bench.report import format_table

    raw = result["median_examples_per_s"]["raw"]
    rows = [[n, " ".join(f"{x:.1f}" for x in xs), result["median_examples_per_s"][n],
             result["median_examples_per_s"][n] / raw]
            for n, xs in result["examples_per_s"].items()]
    out = format_table(["run", "examples/s per round", "median", "vs raw"], rows)
    load = result["load_avg_1m"]
    return (f"{out}\nratio tfdist/raw = {result['ratio']:.3f} (goal >= {result['goal_ratio']}: "
            f"{'met' if result['goal_met'] else 'NOT met'}); load 1m {load['min']:.2f}-"
            f"{load['max']:.2f}")


def plot(result: dict, fig) -> None:
    """Examples/s per round per configuration."""
    ax = fig.add_subplot(111)
    for name, xs in result["examples_per_s"].items():
        ax.plot(range(1, len(xs) + 1), xs, "o-", label=name)
    ax.set_xlabel("round")
    ax.set_ylabel("examples/s")
    ax.set_title(f"{result['recipe']}, {result['workers']} worker(s): "
                 f"tfdist/raw = {result['ratio']:.3f}")
    ax.legend()
