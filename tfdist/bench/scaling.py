"""`python -m tfdist.bench scaling`: weak and strong scaling over 1..N workers on this host.

Every point is a real job: `tfdist.launch -n K` (or `horovodrun -np K` with
`--strategies horovod`) running `tfdist.bench.train_worker`, i.e. the trainer
itself, one intra-op and one inter-op thread per worker, so that each
worker uses one core and the 1-worker baseline no more than its share. Throughput is the trainer's steady
state (examples/s after the first warm-up steps, which trace the step
function); metrics.json's figure, which includes them, is kept beside it.

The 1-worker point is one baseline per recipe and mode, shared by every
engine: `single` through `tfdist.launch -n 1`, so that two engines' curves
differ only in their K-worker runs, never in the noise of their own
baselines. `--repeats R` runs the baseline and every engine's points
interleaved R times; each point is its median run, and the error bars are
the range of the per-repeat efficiencies, each K-worker run against the
baseline of its own repeat. Efficiency above 1
cannot be real here (K workers on K cores' share of one machine) and is
flagged as noise in the JSON, the table and the plot. `--grad-compression
none,fp16` adds a curve per compression (`multi_worker+fp16`, ...).
Horovod's K-worker runs use the Horovod venv's TensorFlow; the shared
baseline runs the system one.

`--cpu-bind cores` puts each of K workers on its own share of the cores
(`tfdist.launch --cpu-bind cores`; `tfdist.bench.bind` under horovodrun) and
the 1-worker baseline on the share worker 0 of N would get, so that the
baseline has no more of the machine than each worker.

Weak scaling keeps the examples per worker fixed (global batch = K x
per-worker batch); strong scaling keeps the global batch fixed (= N x
per-worker batch). In both, speedup = T1/TK for the same amount of work per
worker (weak: scaled speedup, throughput_K / throughput_1) or in total
(strong), and efficiency = speedup / K.

The no-communication control (on unless `--no-control`): for each K, the
same K worker processes, pinned the same way (`--cpu-bind cores`: worker i on
the share worker i of K gets; the same threads), each training alone with
`single` on its K-worker run's per-worker batch, all started together and
held after their warm-up steps until all K got there (`timing.start_barrier`).
Each one's steady step is taken over the time all K were past their warm-up
and none had finished, so that every step counted was a contended one; a
worker through its --steps steps on until all K are (`timing.until_all_done`),
so that window holds the slowest one's steps however fast the others are. The
control's throughput is the sum of the K workers' examples/s; one control per
recipe, mode and K, shared by every engine, interleaved with the rest in each
repeat. Three efficiencies then:

    efficiency          = throughput_K / (K x throughput_1)   (against one worker alone)
    control efficiency  = control_K   / (K x throughput_1)   (contention alone)
    against the control = throughput_K / control_K           (communication)

and efficiency = control efficiency x efficiency against the control. The
control has no collective and no step-by-step synchronization, so waiting for
the slowest worker counts as communication. In strong mode the control's
workers also run the smaller per-worker batch, so the control efficiency holds
that too. Not with `--hosts`.

`--hosts N --rate R`: worker i runs on namespaced host hi, one per host, over
links shaped to R (see `tfdist.bench.on_hosts`); the 1-worker baseline runs
on h0. Beside each K-worker point is `bench comm`'s estimate with the
measured 1-worker step as the compute term and the link rate as the bus
bandwidth (the best a ring all-reduce can do): predicted step = compute x
(per-worker batch / 1-worker batch) + 2(K-1)/K x bytes sent / link rate
(half the gradient bytes under fp16 or bf16 compression).
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time

from tfdist import compression as compression_lib
from tfdist.bench import on_hosts, runs
from tfdist.bench.model_stats import model_stats
from tfdist.bench.allreduce import comm_seconds

DESCRIPTION = "weak and strong scaling over 1..N workers (speedup = T1/TN, efficiency = speedup/N)"
# Examples per worker for weak scaling (docs/benchmarks.md's figures are at these).
PER_WORKER = {"synthetic_cnn": 64, "wide_mlp": 128}
MODES = ("weak", "strong")
# A control worker's steps at most, in --steps: it ends once all K ran --steps (see one_control).
CONTROL_STEP_CAP = 20


def add_arguments(parser) -> None:
    """Flags of this benchmark."""
    parser.add_argument("-n", "--workers", type=int, default=2, help="largest worker count N")
    parser.add_argument("--recipes", default="synthetic_cnn,wide_mlp",
                        help="comma-separated; the first is the headline `weak`/`strong`")
    parser.add_argument("--strategies", default="multi_worker,shm",
                        help="comma-separated: multi_worker, shm and/or horovod (needs the venv)")
    parser.add_argument("--controller", default="gloo", choices=("gloo", "mpi"),
                        help="horovodrun controller for --strategies horovod")
    parser.add_argument("--per-worker-batch", type=int, default=0,
                        help=f"examples per worker (0: per recipe, {PER_WORKER})")
    parser.add_argument("--steps", type=int, default=30, help="training steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="steps excluded from timing")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run the shared baseline and every point R times, interleaved, and "
                             "report the median and the range: shared cores make runs noisy")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per worker")
    parser.add_argument("--inter-op-threads", type=int, default=1,
                        help="inter-op threads per worker (TF_NUM_INTEROP_THREADS; 0: TF's choice)")
    parser.add_argument("--train-flags", default="",
                        help="extra tfdist.train flags for every run, e.g. "
                             "'--preempt-check-steps 1000' (quote them as one argument)")
    parser.add_argument("--venv", default=None, help="Horovod venv (default: as horovod-allreduce)")
    parser.add_argument("--timeout", type=float, default=600.0, help="per run, seconds")
    parser.add_argument("--modes", default="weak,strong", help="weak and/or strong")
    parser.add_argument("--grad-compression", default="none",
                        help="comma-separated, each a curve: none, fp16 and/or bf16")
    parser.add_argument("--cpu-bind", choices=runs.CPU_BIND, default="none",
                        help="cores: each of K workers on its own share of the cores "
                             "(tfdist.launch --cpu-bind cores, tfdist.bench.bind under "
                             "horovodrun), the 1-worker baseline on the share worker 0 of N "
                             "gets; not with --hosts")
    parser.add_argument("--control", action=argparse.BooleanOptionalAction, default=True,
                        help="also run, for each K, the no-communication control: the same K "
                             "workers, pinned the same way, each training alone (`single`), "
                             "started together; efficiency is then also reported against it "
                             "(not with --hosts)")
    parser.add_argument("--hosts", type=int, default=0,
                        help="N>=2: worker i on namespaced host hi (needs root; sets -n N)")
    parser.add_argument("--rate", default=None,
                        help="with --hosts: every link shaped to 1gbit, 10gbit or <n>mbit")


def speedups(throughputs: list[float], workers: list[int]) -> tuple[list[float], list[float]]:
    """Pure function: (speedup, efficiency) per worker count from examples/s.

    Speedup is relative to the first entry, which must be 1 worker.
    """
    if not workers or workers[0] != 1:
        raise ValueError(f"the first point must be 1 worker. Received: workers={workers}.")
    speedup = [t / throughputs[0] for t in throughputs]
    return speedup, [s / k for s, k in zip(speedup, workers)]


def overlap_step_s(times: list[list[float]], warmup: int) -> tuple[list[float], float]:
    """Pure function: each process's mean step while all ran in steady state, and that time.

    Args:
        times: Per process, its step end times (`time.perf_counter()`, one
            clock for every process on a host).
        warmup: Steps at each process's start that do not count.

    Returns:
        (seconds per step of each process over the steps that ended inside the
        window, the window's length in seconds). The window opens when the last
        process ended its warm-up and closes when the first ended its run.

    Raises:
        ValueError: when a process has fewer than 2 step ends in the window:
            the processes did not run long enough side by side.
    """
    start = max(t[warmup] for t in times)
    end = min(t[-1] for t in times)
    steps = []
    for i, t in enumerate(times):
        inside = [x for x in t if start <= x <= end]
        if len(inside) < 2:
            raise ValueError(
                f"process {i} ended {len(inside)} step(s) while all {len(times)} processes "
                f"were past their {warmup} warm-up steps; at least 2 are needed. Pass more "
                f"--steps.")
        steps.append((inside[-1] - inside[0]) / (len(inside) - 1))
    return steps, max(0.0, end - start)


def control_point(results: list[dict], warmup: int) -> dict:
    """Pure function: one control point from its K workers' result lines.

    Throughput is the sum of the workers' examples/s over the time they all
    ran; `step_s` is the step K synchronous workers would take for that
    throughput (K x per-worker batch / throughput), comparable to a K-worker
    run's step.
    """
    worker_steps, overlap = overlap_step_s([r["step_end_times"] for r in results], warmup)
    batches = [r["global_batch_size"] for r in results]
    tput = sum(b / s for b, s in zip(batches, worker_steps))
    return {"workers": len(results), "global_batch_size": sum(batches),
            "examples_per_s": tput, "step_s": sum(batches) / tput,
            "worker_step_s": worker_steps, "worker_batch_size": batches,
            "overlap_s": overlap,
            "worker_steady_s": [r["step_end_times"][-1] - r["step_end_times"][warmup]
                                for r in results]}


def against_control(throughputs: list[float], control: list[float]) -> list[float]:
    """Pure function: throughput_K / control_K per point, the efficiency against the control.

    With efficiency = throughput_K / (K x throughput_1) and the control's own
    efficiency = control_K / (K x throughput_1), efficiency = control
    efficiency x this: contention times communication.
    """
    if len(throughputs) != len(control):
        raise ValueError(f"one control per point. Received: {len(throughputs)} points, "
                         f"{len(control)} controls.")
    return [t / c for t, c in zip(throughputs, control)]


def median_run(tries: list[dict]) -> dict:
    """Pure function: the run with the median step time (lower median), its tries attached."""
    ordered = sorted(tries, key=lambda t: t["step_s"])
    return {**ordered[(len(ordered) - 1) // 2],
            "tries_step_s": [t["step_s"] for t in tries]}


def predicted_steps(step_1: float, batches: list[int], workers: list[int], grad_bytes: float,
                    link_gbs: float) -> list[float]:
    """Pure function: `bench comm`'s step estimate per point from the measured 1-worker step.

    compute = step_1 x batch_K / batch_1 (per-worker batches), comm = a ring
    all-reduce of the gradients at the link rate (`allreduce.comm_seconds`, as
    `bench comm` computes it).
    """
    return [step_1 * b / batches[0] + comm_seconds(grad_bytes, k, link_gbs)
            for b, k in zip(batches, workers)]


def _train_args(args, recipe: str, strategy: str, gbs: int, model_dir: str,
                compression: str = "none", steps: int = 0) -> list[str]:
    extra = ["--grad-compression", compression] if compression != "none" else []
    return [recipe, "--strategy", strategy, "--global-batch-size", str(gbs),
            "--epochs", "1", "--steps-per-epoch", str(steps or args.steps),
            "--threads", str(args.threads),
            "--verbose", "0", "--model-dir", model_dir, "--resume", "false",
            "--csv-log", "false", *extra, *getattr(args, "train_flags", "").split()]


def _venv(args) -> str:
    venv = runs.horovod_venv(args.venv)
    if venv is None:
        raise SystemExit("error: --strategies horovod needs the Horovod venv. "
                         "HINT: run scripts/install_horovod.sh")
    return venv


def one_run(args, recipe: str, strategy: str, workers: int, gbs: int, label: str,
            compression: str = "none") -> dict:
    """One job of `workers` processes; returns the chief's result line plus the load.

    One worker runs `single` whatever `strategy` says: the baseline pays for no
    collective at all.
    """
    with runs.model_dir(args.out, label, getattr(args, "keep_runs", False)) as model_dir:
        return _one_job(args, recipe, strategy, workers, gbs, label, compression, model_dir)


def _one_job(args, recipe: str, strategy: str, workers: int, gbs: int, label: str,
             compression: str, model_dir: str) -> dict:
    """`one_run` in `model_dir`."""
    env = _bench_env(args)
    hosts = getattr(args, "hosts_cluster", None)
    if hosts is not None:
        # One worker runs `single` (on h0): the baseline pays for no collective at all.
        train = (_train_args(args, recipe, "single", gbs, model_dir) if workers == 1 else
                 _train_args(args, recipe, strategy, gbs, model_dir, compression))
        load = runs.load_average()
        if strategy == "horovod" and workers > 1:
            result = on_hosts.run_horovod(hosts, _venv(args), workers, args.controller,
                                          "tfdist.bench.train_worker", train, args.timeout, env,
                                          what=f"scaling run {label}")[0]
        else:
            result = on_hosts.run_workers(hosts, workers, "tfdist.bench.train_worker", train,
                                          args.timeout, env, what=f"scaling run {label}")[0]
        return {**result, "workers": workers, "load_avg_1m": load}
    bind = getattr(args, "cpu_bind", "none")
    if workers == 1:
        # Bound, the baseline gets the share worker 0 of N gets, not every core.
        cmd = runs.launch_command(1, "tfdist.bench.train_worker",
                                  _train_args(args, recipe, "single", gbs, model_dir),
                                  args.timeout, share=f"0/{args.workers}" if bind == "cores"
                                  else None)
    elif strategy == "horovod":
        cmd = runs.horovod_command(_venv(args), workers, args.controller,
                                   "tfdist.bench.train_worker",
                                   _train_args(args, recipe, "horovod", gbs, model_dir, compression),
                                   cpu_bind=bind)
    else:
        cmd = runs.launch_command(workers, "tfdist.bench.train_worker",
                                  _train_args(args, recipe, strategy, gbs, model_dir, compression),
                                  args.timeout, bind)
    load = runs.load_average()
    result = runs.run(cmd, args.timeout + 60, env, what=f"scaling run {label}")[0]
    return {**result, "workers": workers, "load_avg_1m": load}


def _bench_env(args) -> dict:
    env = {"TFDIST_BENCH_WARMUP_STEPS": str(args.warmup)}
    if getattr(args, "inter_op_threads", 0):
        # One intra-op thread is not one core: with TensorFlow's default inter-op pool
        # a `--threads 1` synthetic_cnn worker used 1.5 cores here (user/wall time),
        # so 1 worker would get more of this host than each of 2 does.
        env["TF_NUM_INTEROP_THREADS"] = str(args.inter_op_threads)
    return env


def one_control(args, recipe: str, workers: int, gbs: int, label: str) -> dict:
    """The no-communication control of a K-worker point: K `single` jobs started together.

    Each is `tfdist.launch -n 1` (as the baseline is) on the K-worker run's
    per-worker batch, under `--cpu-bind cores` on the share worker i of K gets
    (`tfdist.bench.bind --share i/K`, the cores `tfdist.launch -n K --cpu-bind
    cores` gives worker i), with the same threads; each waits after its warm-up
    steps for the others (`timing.start_barrier`).
    """
    bind = getattr(args, "cpu_bind", "none")
    keep = getattr(args, "keep_runs", False)
    with contextlib.ExitStack() as stack:
        dirs = [stack.enter_context(runs.model_dir(args.out, f"{label}_w{i}", keep))
                for i in range(workers)]
        # Up to CONTROL_STEP_CAP x --steps each: `timing.until_all_done` ends every one of
        # them once all ran --steps, so a fast one does not end before a slow one started.
        cmds = [runs.launch_command(1, "tfdist.bench.train_worker",
                                    _train_args(args, recipe, "single", gbs // workers, d,
                                                steps=args.steps * CONTROL_STEP_CAP),
                                    args.timeout, share=f"{i}/{workers}" if bind == "cores"
                                    else None)
                for i, d in enumerate(dirs)]
        load = runs.load_average()
        start_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="tfdist-start-"))
        done_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="tfdist-done-"))
        env = {**_bench_env(args), "TFDIST_BENCH_START_DIR": start_dir,
               "TFDIST_BENCH_START_PARTIES": str(workers), "TFDIST_BENCH_DONE_DIR": done_dir,
               "TFDIST_BENCH_DONE_STEPS": str(args.steps)}
        results = [r[0] for r in runs.run_together(cmds, args.timeout + 60, env,
                                                   what=f"scaling control {label}")]
    return {**control_point(results, args.warmup), "load_avg_1m": load, "runs": results}


def engine_name(strategy: str, compression: str) -> str:
    """Pure function: a curve's name, e.g. "multi_worker" or "multi_worker+fp16"."""
    return strategy if compression == "none" else f"{strategy}+{compression}"


def paired_efficiencies(base: list[float], many: list[float], workers: int) -> list[float]:
    """Pure function: efficiency of each repeat, K workers against the 1-worker run of the same
    repeat (examples/s), so that a load change between repeats hits both alike."""
    return [m / (workers * b) for b, m in zip(base, many)]


def noise_flags(efficiency: list[float]) -> list[bool]:
    """Pure function: True where efficiency exceeds 1.

    K workers cannot do more than K times one worker's work on K cores' share
    of the machine; above 1 the baseline was slowed (or the K-worker run
    sped up) by something else on the shared cores.
    """
    return [e > 1.0 for e in efficiency]


def error_bars(efficiency: list[float],
               per_repeat: list[list[float]]) -> list[list[float]] | None:
    """Pure function: matplotlib's `yerr` ([below], [above]) for each point's range over repeats.

    Args:
        efficiency: The plotted efficiency per worker count (from the median runs).
        per_repeat: Each point's per-repeat efficiencies.

    Returns:
        None when no point has two repeats: one sample has no spread to draw.
        Otherwise the distances from each point down to its lowest and up to
        its highest repeat, each at least 0: the median runs can come from
        different repeats, so a point may lie just outside its range (with one
        repeat, by a rounding), and matplotlib refuses negative lengths.
    """
    if all(len(p) < 2 for p in per_repeat):
        return None
    return [[max(0.0, e - min(p)) for e, p in zip(efficiency, per_repeat)],
            [max(0.0, max(p) - e) for e, p in zip(efficiency, per_repeat)]]


def run(args) -> dict:
    """Runs every (recipe, mode, K, strategy, compression) point; returns the curves."""
    link = on_hosts.check_args(getattr(args, "hosts", 0), getattr(args, "rate", None))
    modes = [m for m in getattr(args, "modes", ",".join(MODES)).split(",") if m]
    if not modes or set(modes) - set(MODES):
        raise SystemExit(f"error: --modes takes weak and/or strong. Received: {args.modes!r}.")
    strategies = [s for s in args.strategies.split(",") if s]
    compressions = [c for c in getattr(args, "grad_compression", "none").split(",") if c]
    bad = [c for c in compressions if c not in compression_lib.NAMES]
    if bad or not compressions:
        raise SystemExit(f"error: --grad-compression takes a comma-separated list from "
                         f"{list(compression_lib.NAMES)}. Received: {args.grad_compression!r}.")
    if link:
        if getattr(args, "cpu_bind", "none") != "none":
            raise SystemExit("error: --cpu-bind applies to workers on this host; with --hosts "
                             "each worker has a host of its own. Received: --cpu-bind "
                             f"{args.cpu_bind} --hosts {args.hosts}.")
        args.workers = args.hosts
        if "shm" in strategies:
            raise SystemExit("error: --strategies shm is one host's shared memory; it cannot "
                             "run with --hosts. Pass --strategies multi_worker (or horovod).")
    if args.workers < 2:
        raise SystemExit(f"error: scaling needs -n >= 2. Received: -n {args.workers}.")
    with (on_hosts.shaped_hosts(args.hosts, args.rate) if link
          else contextlib.nullcontext()) as hosts:
        args.hosts_cluster = hosts
        results, baselines, controls = _run_points(args, modes, strategies, compressions, link)
    args.hosts_cluster = None
    first_recipe = next(iter(results))
    headline = results[first_recipe][next(iter(results[first_recipe]))]
    where = (f"worker i on namespaced host hi, links shaped to {args.rate}" if link
             else "all workers on one host")
    keys = ("workers", "speedup", "efficiency", "efficiency_vs_control", "control_efficiency")
    return {**{m: {k: headline[m][k] for k in keys if k in headline[m]} for m in modes},
            "headline": first_recipe, "results": results, "baselines": baselines,
            "control": bool(controls), "controls": controls,
            "threads": args.threads, "grad_compression": compressions,
            "cpu_bind": getattr(args, "cpu_bind", "none"),
            "inter_op_threads": args.inter_op_threads, "train_flags": args.train_flags,
            "steps": args.steps, "warmup_steps": args.warmup, "repeats": args.repeats,
            "hosts": args.workers if link else 0, "rate": args.rate if link else None,
            "link_gbs": link,
            "note": "examples/s after the warm-up steps; one 1-worker baseline (`single`) per "
                    "recipe and mode, shared by every engine; efficiency from the median runs, "
                    "error bars the range of per-repeat efficiencies (each repeat's K-worker "
                    f"run over its own baseline); efficiency > 1 is noise; {where}; "
                    + ("control: per K, the same K workers pinned the same way, each training "
                       "alone (`single`), started together; control efficiency = control / "
                       "(K x 1 worker) is contention alone, efficiency_vs_control = K workers / "
                       "control is communication, and efficiency = their product"
                       if controls else "no control")}


def _run_points(args, modes, strategies, compressions, link) -> tuple[dict, dict, dict]:
    counts = list(range(1, args.workers + 1))
    engines = [(s, c) for s in strategies for c in compressions]
    repeats = max(1, args.repeats)
    with_control = getattr(args, "control", False) and not link
    results, baselines, controls = {}, {}, {}
    recipes = [r for r in args.recipes.split(",") if r]
    per_mode = 1 + (len(counts) - 1) * (len(engines) + with_control)
    progress = Progress(len(recipes) * len(modes) * repeats * per_mode)
    runs.say(f"scaling: {progress.total} runs of {args.steps} steps: {', '.join(recipes)}; "
             f"{', '.join(modes)}; 1..{args.workers} workers; "
             f"{', '.join(engine_name(*e) for e in engines)}"
             + ("; control" if with_control else "")
             + (f"; {repeats} repeats" if repeats > 1 else ""))
    for recipe in recipes:
        per_worker = args.per_worker_batch or PER_WORKER.get(recipe, 64)
        grad_bytes = _grad_bytes(recipe) if link else None
        for mode in modes:
            def gbs(k):
                return per_worker * (k if mode == "weak" else args.workers)

            base_tries, tries = [], {e: {k: [] for k in counts[1:]} for e in engines}
            control_tries = {k: [] for k in counts[1:]}
            # Interleaved: the baseline, the controls, then every engine's points, R times over.
            for rep in range(repeats):
                where = f"{recipe} {mode}" + (f", repeat {rep + 1}/{repeats}"
                                              if repeats > 1 else "")
                base_tries.append(progress.run(
                    f"{where}: 1 worker (the baseline)", lambda: one_run(
                        args, recipe, "single", 1, gbs(1), f"{recipe}_{mode}_1_r{rep}")))
                for k in counts[1:] if with_control else []:
                    control_tries[k].append(progress.run(
                        f"{where}: control, {k} workers alone", lambda: one_control(
                            args, recipe, k, gbs(k), f"{recipe}_control_{mode}_{k}_r{rep}")))
                for strategy, comp in engines:
                    name = engine_name(strategy, comp)
                    for k in counts[1:]:
                        tries[(strategy, comp)][k].append(progress.run(
                            f"{where}: {name}, {k} workers", lambda: one_run(
                                args, recipe, strategy, k, gbs(k),
                                f"{recipe}_{name}_{mode}_{k}_r{rep}", comp)))
            base = median_run(base_tries)
            base_tput = [t["examples_per_s"] for t in base_tries]
            baselines.setdefault(recipe, {})[mode] = {
                "global_batch_size": gbs(1), "step_s": base["step_s"],
                "examples_per_s": base["examples_per_s"], "tries_examples_per_s": base_tput,
                "run": base}
            control = None
            if with_control:
                control = control_curve(base, base_tput, control_tries, counts)
                controls.setdefault(recipe, {})[mode] = control
            for strategy, comp in engines:
                curve = _curve(base, base_tput, tries[(strategy, comp)], counts, strategy, comp)
                if control is not None:
                    curve.update(_against_control(curve, tries[(strategy, comp)], control,
                                                  control_tries, repeats))
                if link:
                    curve.update(_predicted(curve["runs"], counts, grad_bytes, comp, link))
                results.setdefault(recipe, {}).setdefault(
                    engine_name(strategy, comp), {})[mode] = curve
    return results, baselines, controls


def _curve(base, base_tput, tries, counts, strategy, comp) -> dict:
    """One engine's scaling curve: the baseline, then the median run at each worker count."""
    points = [base] + [median_run(tries[k]) for k in counts[1:]]
    return {**efficiency_curve(points, base_tput, tries, counts),
            "strategy": strategy, "grad_compression": comp, "runs": points}


def efficiency_curve(points: list[dict], base_tput: list[float], tries: dict,
                     counts: list[int]) -> dict:
    """Pure function: speed-up, efficiency (median and per repeat, paired with the
    baseline's repeat) and noise flags of `points` (one per worker count, the first the
    baseline), with their examples/s, steps and global batches.

    Args:
        points: The median run at each of `counts`.
        base_tput: The baseline's examples/s per repeat.
        tries: Per K >= 2, the runs of each repeat.
        counts: Worker counts, 1..N.
    """
    tput = [p["examples_per_s"] for p in points]
    speedup, efficiency = speedups(tput, counts)
    per_repeat = [[1.0] * len(base_tput)] + [
        paired_efficiencies(base_tput, [t["examples_per_s"] for t in tries[k]], k)
        for k in counts[1:]]
    return {"workers": counts, "speedup": speedup, "efficiency": efficiency,
            "efficiency_per_repeat": per_repeat,
            "efficiency_range": [[min(p), max(p)] for p in per_repeat],
            "noise": noise_flags(efficiency), "examples_per_s": tput,
            "step_s": [p["step_s"] for p in points],
            "global_batch_size": [p["global_batch_size"] for p in points]}


def _predicted(points, counts, grad_bytes, comp, link) -> dict:
    """The link model's prediction beside a curve (`--link`)."""
    wire = compression_lib.wire_bytes(grad_bytes, comp)
    batches = [p["global_batch_size"] // k for p, k in zip(points, counts)]
    pred = predicted_steps(points[0]["step_s"], batches, counts, wire, link)
    # throughput_K / (K x throughput_1), with the predicted step.
    return {"grad_bytes": grad_bytes, "wire_bytes": wire, "predicted_step_s": pred,
            "predicted_efficiency": [points[0]["step_s"] * b / batches[0] / p
                                     for p, b in zip(pred, batches)]}


class Progress:
    """Says each run of the benchmark as it ends, with its figure and its time."""

    def __init__(self, total: int):
        self.total, self.done = total, 0

    def run(self, what: str, job):
        """`job()`, then one line: '[3/10] digits_mlp weak: shm, 2 workers: 2412 examples/s'."""
        start = time.perf_counter()
        result = job()
        self.done += 1
        runs.say(f"[{self.done}/{self.total}] {what}: {result['examples_per_s']:.0f} "
                 f"examples/s ({time.perf_counter() - start:.0f} s)")
        return result


def median_control(tries: list[dict]) -> dict:
    """Pure function: the control try with the median throughput (lower median), tries attached.

    By throughput, not step: a control's throughput is its figure (its step is
    derived from it).
    """
    ordered = sorted(tries, key=lambda t: -t["examples_per_s"])
    return {**ordered[(len(ordered) - 1) // 2],
            "tries_examples_per_s": [t["examples_per_s"] for t in tries]}


def control_curve(base: dict, base_tput: list[float], control_tries: dict,
                  counts: list[int]) -> dict:
    """Pure function: the control's curve for one recipe and mode; its 1-worker point is the
    baseline (one worker alone is its own control).

    Args:
        base: The baseline's median run.
        base_tput: The baseline's examples/s per repeat.
        control_tries: Per K >= 2, the control points of each repeat (`one_control`).
        counts: Worker counts, 1..N.
    """
    points = [{**base, "workers": 1, "worker_step_s": [base["step_s"]],
               "worker_batch_size": [base["global_batch_size"]]}] + [
        median_control(control_tries[k]) for k in counts[1:]]
    return {**efficiency_curve(points, base_tput, control_tries, counts),
            "worker_step_s": [p["worker_step_s"] for p in points],
            "overlap_s": [p.get("overlap_s") for p in points],
            "tries_examples_per_s": [base_tput] + [
                [t["examples_per_s"] for t in control_tries[k]] for k in counts[1:]],
            "runs": points}


def _against_control(curve: dict, tries: dict, control: dict, control_tries: dict,
                     repeats: int) -> dict:
    """A curve's efficiency against the control: from the median runs, and per repeat (each
    repeat's K-worker run over the control of the same repeat)."""
    counts = curve["workers"]
    vs = against_control(curve["examples_per_s"], control["examples_per_s"])
    per_repeat = [[1.0] * repeats] + [
        against_control([t["examples_per_s"] for t in tries[k]],
                        [c["examples_per_s"] for c in control_tries[k]]) for k in counts[1:]]
    return {"efficiency_vs_control": vs, "efficiency_vs_control_per_repeat": per_repeat,
            "efficiency_vs_control_range": [[min(p), max(p)] for p in per_repeat],
            "noise_vs_control": noise_flags(vs),
            "control_efficiency": control["efficiency"]}


def _grad_bytes(recipe: str) -> int:
    return model_stats(recipe)["grad_bytes"]


CONTROL = "control (no comm)"
TABLE_WIDTH = 100  # what a terminal shows: every line of `table` fits


def table(result: dict) -> str:
    """The figures, one block per recipe and mode, one row per (engine, workers), the
    control's rows first; with --hosts, the prediction beside. Within 100 columns: the
    recipe, mode and load are in each block's title, the notes wrapped."""
    import textwrap

    from tfdist.bench.report import format_table

    link = result.get("link_gbs")
    controls = result.get("controls") or {}
    head = ["engine", "N", "batch", "step ms", "ex/s", "speedup", "efficiency", "range"]
    head += ["vs ctrl"] if controls else []
    head += ["pred ms", "pred eff"] if link else []
    head.append("flag")

    def row(engine, c, i, vs=None):
        lo, hi = c["efficiency_range"][i]
        out = [engine, str(c["workers"][i]), str(c["global_batch_size"][i]),
               f"{c['step_s'][i] * 1e3:.1f}", f"{c['examples_per_s'][i]:.0f}",
               f"{c['speedup'][i]:.2f}", f"{c['efficiency'][i]:.2f}", f"{lo:.2f}-{hi:.2f}"]
        if controls:
            out.append("" if vs is None else f"{vs:.2f}")
        if link:
            out += ([f"{c['predicted_step_s'][i] * 1e3:.1f}",
                     f"{c['predicted_efficiency'][i]:.2f}"]
                    if "predicted_step_s" in c else ["", ""])
        noisy = c["noise"][i] or (c.get("noise_vs_control") or [False] * (i + 1))[i]
        return out + ["noise" if noisy else ""]

    blocks = []
    for recipe, by_engine in result["results"].items():
        modes = [m for m in MODES if any(m in curves for curves in by_engine.values())]
        for mode in modes:
            rows, loads = [], []
            control = controls.get(recipe, {}).get(mode)
            for engine, c in ([(CONTROL, control)] if control is not None else []) + [
                    (engine, curves[mode]) for engine, curves in by_engine.items()
                    if mode in curves]:
                for i in range(len(c["workers"])):
                    vs = c["efficiency_vs_control"][i] if "efficiency_vs_control" in c else None
                    rows.append(row(engine, c, i, vs))
                    loads.append(c["runs"][i]["load_avg_1m"])
            blocks.append(f"{recipe}, {mode} scaling (load 1m {min(loads):.1f}-"
                          f"{max(loads):.1f}):\n" + format_table(head, rows))
    notes = [f"N workers; 1 = one shared `single` baseline per recipe and mode; "
             f"{result['repeats']} repeat(s), the median shown, range: efficiency over the "
             "repeats; efficiency = speedup / N; noise: above 1, which cannot be real here."]
    if controls:
        notes.append(f"{CONTROL}: the same N workers, pinned the same way, each training alone, "
                     "started together; its efficiency is contention alone. vs ctrl = ex/s over "
                     "the control's: communication (efficiency = control's efficiency x vs "
                     "ctrl).")
    if link:
        notes.append(f"Worker i on host hi, links shaped to {result['rate']} ({link:.3f} GB/s); "
                     "pred: measured 1-worker compute + ring all-reduce of the bytes sent at "
                     "the link rate.")
    return "\n".join([textwrap.fill(n, TABLE_WIDTH) for n in notes] + blocks)


def plot(result: dict, fig) -> None:
    """Efficiency per worker count with the per-repeat range, per mode, per recipe/engine.

    Error bars are the range over repeats. With the control: the top row is
    efficiency against one worker, with the control's own (contention alone)
    dashed in grey per recipe; the bottom row is each engine's efficiency
    against the control (communication).
    """
    modes = [m for m in MODES if m in result]
    controls = result.get("controls") or {}
    axes = fig.subplots(2 if controls else 1, len(modes), squeeze=False)
    colors = series_colors(result)
    for col, mode in enumerate(modes):
        curves = [(recipe, engine, by_engine[engine][mode])
                  for recipe, by_engine in result["results"].items() for engine in by_engine]
        extra = [(recipe, CONTROL, by_mode[mode]) for recipe, by_mode in controls.items()
                 if mode in by_mode]
        title = f"{mode} scaling, {result['repeats']} repeat(s)"
        _efficiency_axes(axes[0][col], curves, extra, colors, "efficiency", "noise", result,
                         "speedup / N (bars: range)" if controls
                         else "efficiency (speedup / N), range over repeats",
                         title + (": against 1 worker" if controls else ""))
        if controls:
            _efficiency_axes(axes[1][col], curves, [], colors, "efficiency_vs_control",
                             "noise_vs_control", result,
                             "K workers / control (bars: range)",
                             f"{mode}: against the no-comm control")


def series_colors(result: dict) -> dict:
    """Pure function: {(recipe, engine): matplotlib colour}, one per series for every panel.

    Fixed here rather than taken from each panel's colour cycle, which any
    other line drawn first (a noise marker) advances.
    """
    series = [(recipe, engine) for recipe, by_engine in result["results"].items()
              for engine in by_engine]
    return {s: f"C{i % 10}" for i, s in enumerate(series)}


def _efficiency_axes(ax, curves, controls, colors, key, noise_key, result, ylabel,
                     title) -> None:
    """One panel: each curve's `key` with its per-repeat range, the controls dashed."""
    flagged = False
    every = curves + controls
    for i, (recipe, engine, c) in enumerate(every):
        if key not in c:
            continue
        # A small offset per curve, so error bars at one worker count do not overlap.
        xs = [k + 0.04 * (i - (len(every) - 1) / 2) for k in c["workers"]]
        err = error_bars(c[key], c[f"{key}_per_repeat"])
        # The controls in grey, one marker per recipe; each engine its colour in every panel.
        style = (dict(fmt="sD^v"[(i - len(curves)) % 4] + "--", color="dimgrey")
                 if engine == CONTROL else dict(fmt="o-", color=colors[(recipe, engine)]))
        label = (f"{recipe} control: contention alone" if engine == CONTROL
                 else f"{recipe} ({engine})")
        line = ax.errorbar(xs, c[key], yerr=err, capsize=3, label=label, **style)
        color = line[0].get_color()
        noisy = [(x, e) for x, e, n in zip(xs, c[key], c[noise_key]) if n]
        if noisy:
            flagged = True
            ax.plot(*zip(*noisy), "o", markersize=12, color="red", markerfacecolor="none")
        if key == "efficiency" and "predicted_efficiency" in c:
            ax.plot(xs, c["predicted_efficiency"], "x--", color=color,
                    label=f"{recipe} ({engine}), predicted")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    if flagged:
        ax.plot([], [], "o", color="red", markerfacecolor="none",
                label="above 1: noise")
    counts = every[0][2]["workers"] if every else [1]
    ax.set_xticks(counts)
    ax.set_xlabel("workers" + (f" (one per host, {result['rate']})" if result.get("rate")
                               else ""))
    ax.set_ylabel(ylabel, fontsize=8)
    top = max([1.2] + [hi for _, _, c in every for _, hi in c.get(f"{key}_range", [])])
    ax.set_ylim(0, top + 0.05)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6)
