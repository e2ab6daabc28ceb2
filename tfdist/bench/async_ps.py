"""`python -m tfdist.bench async`: synchronous vs asynchronous training, with a straggler.

Runs the same recipe, batch, learning rate and number of optimizer steps twice
per straggler delay: synchronously (`multi_worker`, M workers started by
`tfdist.launch -n M`) and asynchronously (`parameter_server`, a chief, M
workers and 1 ps started by `tfdist.launch --ps 1 --workers M`). One worker
sleeps `delay` ms in each of its steps. Reports examples/s and the final
training and test loss of each run. Imports no TensorFlow: every run is a
fresh set of processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from tfdist.bench.runs import child_env, model_dir as scratch_model_dir

DESCRIPTION = "sync (multi_worker) vs async (parameter_server) throughput and loss, one slow worker"
MODES = ("sync", "async")


def add_arguments(parser) -> None:
    """Flags of this benchmark."""
    parser.add_argument("--recipe", default="digits_mlp")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=0, help="0: one pass")
    parser.add_argument("--delays-ms", default="0,100",
                        help="comma-separated straggler delays; each runs sync and async")
    parser.add_argument("--straggler-worker", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    parser.add_argument("--timeout", type=float, default=300.0, help="per run, seconds")


def command(mode: str, args, delay_ms: int, model_dir: str) -> list[str]:
    """Pure function: the launch command of one run."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}. Received: {mode!r}.")
    launch = [sys.executable, "-m", "tfdist.launch"]
    launch += (["-n", str(args.workers)] if mode == "sync"
               else ["--ps", "1", "--workers", str(args.workers)])
    launch += ["--timeout", f"{args.timeout:g}", "--", sys.executable, "-m", "tfdist.train",
               args.recipe, "--strategy", "multi_worker" if mode == "sync" else "parameter_server",
               "--epochs", str(args.epochs), "--steps-per-epoch", str(args.steps_per_epoch),
               "--threads", str(args.threads), "--verbose", "0", "--model-dir", model_dir,
               "--straggler-delay-ms", str(delay_ms),
               "--straggler-worker", str(args.straggler_worker)]
    return launch


def _one(mode: str, args, delay_ms: int) -> dict:
    with scratch_model_dir(args.out, f"{mode}_{delay_ms}ms",
                           getattr(args, "keep_runs", False)) as model_dir:
        cmd = command(mode, args, delay_ms, model_dir)
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout + 60,
                              env=child_env())
        if proc.returncode != 0:
            raise RuntimeError(f"{mode} run with delay {delay_ms} ms failed "
                               f"(rc={proc.returncode}):\n{proc.stderr[-3000:]}")
        with open(os.path.join(model_dir, "metrics.json"), encoding="utf-8") as f:
            metrics = json.load(f)
    return {"mode": mode, "delay_ms": delay_ms, "strategy": metrics["strategy"],
            "examples_per_s": metrics["examples_per_s"],
            "train_time_s": metrics["wall_time_s"], "job_time_s": time.perf_counter() - start,
            "loss_per_epoch": metrics["history"]["loss"],
            "final_train_loss": metrics["history"]["loss"][-1],
            "test_loss": metrics["test"]["loss"], "test": metrics["test"],
            "steps_per_worker": metrics.get("steps_per_worker")}


def run(args) -> dict:
    """Runs sync and async once per delay; returns the runs and the speed-ups."""
    delays = [int(d) for d in args.delays_ms.split(",") if d.strip()]
    runs = [_one(mode, args, d) for d in delays for mode in MODES]
    by = {(r["mode"], r["delay_ms"]): r for r in runs}
    speedup = {str(d): by["async", d]["examples_per_s"] / by["sync", d]["examples_per_s"]
               for d in delays}
    return {"recipe": args.recipe, "workers": args.workers, "ps": 1, "epochs": args.epochs,
            "straggler_worker": args.straggler_worker, "threads": args.threads,
            "delays_ms": delays, "runs": runs, "async_over_sync_throughput": speedup,
            "note": "examples/s counts the training loop only (no start-up); sync and async "
                    "run the same number of optimizer steps of the same batch size."}


def table(result: dict) -> str:
    """One row per run."""
    from tfdist.bench.report import format_table

    rows = [[r["mode"], r["delay_ms"], r["examples_per_s"], r["final_train_loss"],
             r["test_loss"], str(r["steps_per_worker"] or "-")] for r in result["runs"]]
    out = format_table(["mode", "delay_ms", "examples/s", "train loss", "test loss",
                        "steps/worker"], rows)
    ratios = ", ".join(f"{d} ms: {v:.2f}x" for d, v in
                       result["async_over_sync_throughput"].items())
    return f"{out}\nasync/sync throughput: {ratios}"


def plot(result: dict, fig) -> None:
    """Throughput per delay (bars) and loss per epoch (lines)."""
    delays = result["delays_ms"]
    left, right = fig.subplots(1, 2)
    width = 0.38
    for k, mode in enumerate(MODES):
        values = [next(r["examples_per_s"] for r in result["runs"]
                       if r["mode"] == mode and r["delay_ms"] == d) for d in delays]
        left.bar([i + (k - 0.5) * width for i in range(len(delays))], values, width, label=mode)
    left.set_xticks(range(len(delays)), [f"{d} ms" for d in delays])
    left.set_xlabel(f"straggler delay on worker {result['straggler_worker']}")
    left.set_ylabel("examples/s")
    left.set_title(f"{result['recipe']}, {result['workers']} workers")
    left.legend()
    for r in result["runs"]:
        right.plot(range(1, len(r["loss_per_epoch"]) + 1), r["loss_per_epoch"],
                   marker="o", linestyle="-" if r["mode"] == "sync" else "--",
                   label=f"{r['mode']} {r['delay_ms']} ms")
    right.set_xlabel("epoch")
    right.set_ylabel("training loss")
    right.legend()
