"""`python -m tfdist.bench zero`: what each `--shard` level saves and what it costs (#41, #51).

For each strategy, side by side in one run and alternated `--repeats` times:
N workers training the same model at each level of `--levels` (none,
optimizer, gradients, parameters). Per worker: the peak resident memory up to the end of
the last training step (VmHWM, `tfdist.bench.memory`), and the run's median
steady step. Each level's saving is compared with what it removes from the
most loaded worker (`tfdist.zero.partition`): at "optimizer" the optimizer
state of the variables it does not own, at "gradients" that and one copy of
their gradients (the reduced gradients it no longer receives), at
"parameters" those and the weights of other workers' rows
(`parameters_saving`). #41's goal:
at least 0.8 of that, the step within 10% of the unsharded one; #51's:
"gradients" within 1.05x of "optimizer"; "parameters" within 1.3x of the
unsharded step, and each worker's peak at most 1.25 x its bound: the training
state (weights, gradients, optimizer state) over N, two of the largest layer's
weights (the gathered layer and the next one's prefetch) and one worker's
baseline, measured as the same job of the model at 8 hidden units
(`parameters_bound`).
"""

from __future__ import annotations

import shlex
import statistics

from tfdist.bench import memory, runs
from tfdist.bench.pipeline_processes import COMMON, _run
from tfdist.zero.partition import LEVELS

DESCRIPTION = ("state sharded across workers (ZeRO-1, ZeRO-2, ZeRO-3): per-worker peak memory "
               "and step time at each --shard level")
# 4 Dense 4096x4096 (and the 64-input first layer): 0.27 GB of weights, 0.54 GB of Adam state.
MODEL = ("model_parallel_mlp --hidden-layers 5 --hidden-units 4096 --optimizer adam "
         "--global-batch-size 64")
STRATEGIES = ("multi_worker", "shm", "horovod")
SLOTS_PER_WEIGHT = {"sgd": 1, "adam": 2, "adamw": 2, "rmsprop": 1, "nadam": 2, "adamax": 2}
TARGET_SAVED = 0.8  # #41: at least 0.8 x the state a worker no longer holds
TARGET_STEP = 1.10  # #41: within 10% of the unsharded step
TARGET_GRADIENTS_STEP = 1.05  # #51: "gradients" within 5% of "optimizer"
TARGET_PARAMETERS_STEP = 1.3  # #51: "parameters" within 1.3x of the unsharded step
TARGET_PARAMETERS_PEAK = 1.25  # #51: each worker's peak over `parameters_bound`
BASELINE_UNITS = "8"  # the baseline job: the model at 8 hidden units (TensorFlow's own)
MIB = memory.MB


def add_arguments(parser) -> None:
    """Flags of this benchmark."""
    parser.add_argument("-n", "--workers", type=int, default=4)
    parser.add_argument("--strategies", default="multi_worker,shm",
                        help="comma-separated, of multi_worker, shm and horovod (horovodrun "
                             "--gloo ranks of the Horovod venv: scripts/install_horovod.sh)")
    parser.add_argument("--venv", default=None,
                        help="the Horovod venv (default: $TFDIST_HOROVOD_VENV or "
                             "~/.cache/tfdist/horovod-venv)")
    parser.add_argument("--model", default=MODEL, help="RECIPE [--key value ...]")
    parser.add_argument("--levels", default=",".join(LEVELS),
                        help="comma-separated --shard levels, none first (the baseline)")
    parser.add_argument("--steps", type=int, default=8, help="training steps per run")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per worker")
    parser.add_argument("--interval-s", type=float, default=0.05, help="memory sampling period")
    parser.add_argument("--timeout", type=float, default=500.0)


def expected_saving(state_bytes: list[int], n: int, grad_bytes: list[int] | None = None) -> int:
    """Pure function: the bytes the most loaded worker no longer holds.

    Args:
        state_bytes: Each trainable variable's optimizer-state bytes, in order.
        n: Workers.
        grad_bytes: Each variable's gradient bytes (at "gradients": the reduced
            gradients of the variables a worker does not own), or None.
    """
    from tfdist.zero.partition import owned_bytes, owners

    if grad_bytes is None:
        return sum(state_bytes) - max(owned_bytes(state_bytes, n))
    # Owners are chosen by weight size; each worker keeps its owned state and gradients.
    owner = owners(grad_bytes, n)
    kept = [sum(s + g for s, g, o in zip(state_bytes, grad_bytes, owner) if o == r)
            for r in range(n)]
    return sum(state_bytes) + sum(grad_bytes) - max(kept)


def parameters_saving(state_bytes: list[int], weight_bytes: list[int], rows: list[int],
                      n: int) -> int:
    """Pure function: the bytes a worker no longer holds at "parameters": of each variable
    (its state, one gradient and the weight itself) all but its padded share of rows,
    ceil(rows / n) (`partition.row_share`).

    Args:
        state_bytes: Each trainable variable's optimizer-state bytes.
        weight_bytes: Each variable's bytes.
        rows: Each variable's first dimension.
        n: Workers.
    """
    from tfdist.zero.partition import row_share

    out = 0
    for state, weight, r in zip(state_bytes, weight_bytes, rows):
        per = row_share(r, n, 0)[2]
        out += round((state + 2 * weight) * (1 - per / max(r, 1)))
    return out


def parameters_bound(training_state: int, largest_layer: int, baseline: int, n: int) -> int:
    """Pure function: what a worker at "parameters" may hold, before #51's 1.25x: its
    share of the training state, two of the largest layer's weights (the layer being
    gathered and the next one's prefetch) and one worker's baseline.

    Args:
        training_state: Bytes of every weight, one gradient each, and the optimizer state.
        largest_layer: Bytes of the largest layer's weights.
        baseline: One worker's peak on the same job with a tiny model.
        n: Workers.
    """
    return -(-training_state // n) + 2 * largest_layer + baseline


def baseline_model(model_text: str) -> str | None:
    """The model text at `BASELINE_UNITS` hidden units, or None when it has no
    `--hidden-units` (no baseline job, no bound)."""
    argv = shlex.split(model_text)
    if "--hidden-units" not in argv[:-1]:
        return None
    i = argv.index("--hidden-units")
    return shlex.join([*argv[:i + 1], BASELINE_UNITS, *argv[i + 2:]])


def _state_bytes(model_text: str) -> tuple[list[int], list[int], list[int], int]:
    """Each trainable variable's optimizer-state bytes (slots per weight x its bytes), its
    bytes, its first dimension (rows), and the largest layer's weight bytes."""
    from tfdist import config, recipe as recipe_lib
    from tfdist.compat.tf_startup_logs import import_tensorflow

    name, *argv = shlex.split(model_text)
    module = recipe_lib.load(name)
    cfg = config.merge(module.DECLARED, argv, f"recipe {name}")
    per = SLOTS_PER_WEIGHT[cfg.typed.optimization.optimizer]
    import_tensorflow()
    model = recipe_lib.build_model(module, cfg)
    from tfdist.zero.optimizer import variable_bytes

    sizes = [variable_bytes(v) for v in model.trainable_variables]
    rows = [int(v.shape[0]) if len(v.shape) else 1 for v in model.trainable_variables]
    layers: dict = {}
    for v, b in zip(model.trainable_variables, sizes):
        layer = v.path.rpartition("/")[0]
        layers[layer] = layers.get(layer, 0) + b
    return [per * b for b in sizes], sizes, rows, max(layers.values(), default=0)


def _levels(text: str) -> list[str]:
    levels = [v for v in text.split(",") if v]
    if not levels or levels[0] != "none" or len(set(levels)) != len(levels) or any(
            v not in LEVELS for v in levels):
        raise SystemExit(f"error: --levels takes none first, then any of "
                         f"{', '.join(LEVELS[1:])}, each once. Received: {text!r}.")
    return levels


def run(args) -> dict:
    """Runs every (strategy, level) pair `--repeats` times; returns per-worker figures."""
    strategies = [s for s in args.strategies.split(",") if s]
    if not strategies or any(s not in STRATEGIES for s in strategies):
        raise SystemExit(f"error: --strategies takes {', '.join(STRATEGIES)}. Received: "
                         f"{args.strategies!r}.")
    if args.workers < 2:
        raise SystemExit(f"error: zero needs -n >= 2. Received: -n {args.workers}.")
    levels = _levels(getattr(args, "levels", ",".join(LEVELS)))
    venv = None
    if "horovod" in strategies:
        venv = runs.horovod_venv(getattr(args, "venv", None))
        if venv is None:
            raise SystemExit("error: --strategies horovod needs the Horovod venv. HINT: run "
                             "scripts/install_horovod.sh, or pass --venv.")
    state, weights, rows_of, largest_layer = _state_bytes(args.model)
    tiny = baseline_model(args.model) if "parameters" in levels else None
    expected = {"optimizer": expected_saving(state, args.workers),
                "gradients": expected_saving(state, args.workers, weights),
                "parameters": parameters_saving(state, weights, rows_of, args.workers)}
    common = [*COMMON, "--steps-per-epoch", str(args.steps), "--threads", str(args.threads),
              "--save-every-steps", "0"]
    base = [*shlex.split(args.model), *common]
    tries = {(s, level): [] for s in strategies for level in levels}
    baselines = {}
    for strategy in strategies:
        if tiny is not None:
            argv = [*shlex.split(tiny), *common, "--strategy", strategy]
            baselines[strategy] = max(p["train_peak_bytes"] for p in _run(
                argv, args.workers, args.timeout, args.interval_s, warmup=args.warmup,
                horovod_venv=venv if strategy == "horovod" else None)["processes"])
    for _ in range(max(1, args.repeats)):
        for strategy in strategies:
            for level in levels:
                argv = [*base, "--strategy", strategy,
                        *(["--shard", level] if level != "none" else [])]
                tries[(strategy, level)].append(_run(
                    argv, args.workers, args.timeout, args.interval_s, warmup=args.warmup,
                    horovod_venv=venv if strategy == "horovod" else None))
    rows = []
    for strategy in strategies:
        peaks = {level: [max(r["processes"][w]["train_peak_bytes"] for r in tries[(strategy,
                                                                                   level)])
                         for w in range(args.workers)] for level in levels}
        steps = {level: statistics.median(r["median_step_s"] for r in tries[(strategy, level)])
                 for level in levels}
        saved = {level: [p - s for p, s in zip(peaks["none"], peaks[level])]
                 for level in levels[1:]}
        bound = None
        if strategy in baselines:
            bound = parameters_bound(sum(state) + 2 * sum(weights), largest_layer,
                                     baselines[strategy], args.workers)
        rows.append({
            "strategy": strategy, "peak_bytes": peaks, "step_s": steps,
            "baseline_peak_bytes": baselines.get(strategy),
            "parameters_bound_bytes": bound,
            "parameters_peak_over_bound": None if bound is None else
            max(peaks["parameters"]) / bound,
            "saved_over_expected": {v: min(saved[v]) / expected[v] for v in levels[1:]},
            "step_ratio": {v: steps[v] / steps["none"] for v in levels[1:]},
            "loads": [r["load_avg_1m"] for v in levels for r in tries[(strategy, v)]],
            "final_loss": {v: tries[(strategy, v)][-1]["final_loss"] for v in levels}})
    return {"model": args.model, "workers": args.workers, "levels": levels,
            "state_bytes": sum(state), "weight_bytes": sum(weights),
            "largest_layer_bytes": largest_layer, "baseline_model": tiny,
            "expected_saving_bytes": {v: expected[v] for v in levels[1:]},
            "steps": args.steps, "warmup": args.warmup,
            "repeats": args.repeats, "threads": args.threads, "rows": rows,
            "goals": {"saved_over_expected": TARGET_SAVED, "step_ratio": TARGET_STEP,
                      "gradients_over_optimizer_step": TARGET_GRADIENTS_STEP,
                      "parameters_step_ratio": TARGET_PARAMETERS_STEP,
                      "parameters_peak_over_bound": TARGET_PARAMETERS_PEAK},
            "note": "peak = VmHWM up to the last training step; saved = unsharded - sharded "
                    "peak per worker, the least over workers; expected = what the most loaded "
                    "worker no longer holds (optimizer: state; gradients: state and one copy "
                    "of the gradients; parameters: those and the weights, but its rows); "
                    "step = median steady step, median over repeats, its ratio to none; "
                    "parameters bound = training state / N + 2 x the largest layer's "
                    "weights + the peak of the same job at 8 hidden units (baseline)"}


def table(result: dict) -> str:
    """The readable summary."""
    levels = result["levels"]
    lines = [f"{result['model']}, {result['workers']} workers: optimizer state "
             f"{result['state_bytes'] / MIB:.0f} MiB, weights {result['weight_bytes'] / MIB:.0f}"
             " MiB; the most loaded worker no longer holds " + ", ".join(
                 f"{b / MIB:.0f} MiB at {v}" for v, b in result["expected_saving_bytes"].items()),
             f"{'strategy':<14}{'level':<11}{'peak MiB (each worker)':<30}"
             f"{'saved/expected':>15}{'step s':>9}{'ratio':>7}"]
    for row in result["rows"]:
        for level in [v for v in levels if v in row["peak_bytes"]]:
            peak = ",".join(f"{b / MIB:.0f}" for b in row["peak_bytes"][level])
            saved = row["saved_over_expected"].get(level)
            ratio = row["step_ratio"].get(level, 1.0)
            lines.append(f"{row['strategy']:<14}{level:<11}{peak:<30}"
                         f"{'' if saved is None else f'{saved:.2f}':>15}"
                         f"{row['step_s'][level]:>9.3f}{ratio:>7.2f}")
        if row.get("parameters_bound_bytes"):
            lines.append(f"{'':<14}parameters' largest peak / bound "
                         f"({row['parameters_bound_bytes'] / MIB:.0f} MiB, baseline "
                         f"{row['baseline_peak_bytes'] / MIB:.0f}): "
                         f"{row['parameters_peak_over_bound']:.2f}")
    goals = result["goals"]
    lines.append(f"goals: saved/expected >= {goals['saved_over_expected']}, step ratio <= "
                 f"{goals['step_ratio']}; gradients' step <= "
                 f"{goals['gradients_over_optimizer_step']} x optimizer's")
    if "parameters_step_ratio" in goals:
        lines.append(f"       parameters' step ratio <= {goals['parameters_step_ratio']}, "
                     f"peak / bound <= {goals['parameters_peak_over_bound']}")
    return "\n".join(lines)


COLORS = {"none": "tab:gray", "optimizer": "tab:blue", "gradients": "tab:green",
          "parameters": "tab:red"}


def plot(result: dict, fig) -> None:
    """Per-worker peaks and the step times at each level, per strategy."""
    rows, levels = result["rows"], result["levels"]
    mem, step = fig.subplots(1, 2)
    width = 0.8 / len(levels)
    for i, row in enumerate(rows):
        xs = [i * (result["workers"] + 1) + w for w in range(result["workers"])]
        for j, level in enumerate(levels):
            if level not in row["peak_bytes"]:
                continue
            mem.bar([x + (j - (len(levels) - 1) / 2) * width for x in xs],
                    [b / MIB for b in row["peak_bytes"][level]], width,
                    color=COLORS[level], label=level if i == 0 else None)
        mem.text(xs[0], 0, row["strategy"], va="bottom")
    mem.set_ylabel("peak RSS per worker (MiB)")
    mem.set_xlabel("worker, per strategy")
    mem.legend()
    xs = range(len(rows))
    for j, level in enumerate(levels):
        step.bar([x + (j - (len(levels) - 1) / 2) * width for x in xs],
                 [r["step_s"].get(level, 0.0) for r in rows], width, color=COLORS[level],
                 label=level)
    step.set_xticks(list(xs), [r["strategy"] for r in rows])
    step.set_ylabel("median step (s)")
    step.legend()
    fig.suptitle(f"--shard, {result['workers']} workers: {result['model']}", fontsize=8)
