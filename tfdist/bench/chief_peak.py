"""`pipeline-processes --parts chief`: the chief's peak over a whole run of stage processes (#40).

Two real jobs of `tfdist.train --strategy pipeline --devices 0` on P stage
processes in one model directory, every task's VmHWM sampled
(`tfdist.bench.memory`):

- first: one epoch, a backup every --chief-save-every-steps and at its end,
  then the final weights (`--final-weights`, sharded by default);
- resumed: the same command for two epochs: it resumes from the first job's
  last backup (each task reading its own part), trains the second epoch,
  backs up and writes the final weights again.

Each task's whole-run peak is the larger of its two. Its share is what the
chief's memory table prints for it before the first step (weights, optimizer
slots, gradients and activations in flight: `memory_plan`). TensorFlow's
baseline is measured per task: the same two jobs with every layer
--chief-baseline-units wide (8: the model's bytes vanish, its graph, optimizer,
micro-batches, backups, resume and save do not), each task's whole-run peak.
It is what that role costs whatever the model's size: a serving stage about
720 MiB; the chief about 60 MiB more (Keras's fit loop, the data pipeline and
the driving of the whole multi-task step function, which only the chief
traces and runs), measured the same from 8 to 4096 units wide. A bare process
importing TensorFlow and Keras and running one op (`BASELINE_CODE`, about 660
MiB) is reported beside it.

What a stage process holds beyond share + baseline (the update's and the
restore's temporaries, which the plan does not count) is its excess; the
allowance is the largest excess of the tasks that only serve their stage (not
the chief), so the verdict, chief peak <= its share + its baseline +
allowance, says that what the chief holds grows with the model no more than a
serving stage's does: nothing of the other stages' weights passes through it
while it drives the run, backs it up, resumes it or writes its final weights.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time

from tfdist.bench import memory, runs

MODEL = runs.LARGE_MLP + " --learning-rate 0.001 --seed 0 --verbose 0"
BASELINE_UNITS = 8
BASELINE_CODE = "import tensorflow as tf, keras; tf.reduce_sum(tf.ones([8])).numpy()"
MIB = memory.MB
_UNITS = {"KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30}
_ROW = re.compile(r"^(?:\[worker \d+\] )?task:(\d+)\s+(.*)$")
_AMOUNT = re.compile(r"([\d.]+) (KiB|MiB|GiB)")


def add_arguments(parser):
    """Flags of this part."""
    parser.add_argument("--chief-model", default=MODEL,
                        help="chief part: RECIPE [--key value ...]")
    parser.add_argument("--chief-stages", type=int, default=4, help="chief part: P")
    parser.add_argument("--chief-steps", type=int, default=4,
                        help="chief part: steps per epoch (2 epochs over the two jobs)")
    parser.add_argument("--chief-save-every-steps", type=int, default=2,
                        help="chief part: a backup every N steps (and at each epoch's end)")
    parser.add_argument("--chief-final-weights", default="sharded",
                        help="chief part: --final-weights of both jobs")
    parser.add_argument("--chief-repeats", type=int, default=3,
                        help="chief part: each pair of jobs run R times, alternated; each "
                             "task's peak is its median over them")
    parser.add_argument("--chief-baseline-units", type=int, default=BASELINE_UNITS,
                        help="chief part: each task's baseline is its peak in the same two "
                             "jobs with layers this wide (0: the bare process's peak for "
                             "every task)")


def narrowed(model: str, units: int) -> str:
    """Pure function: the model's command with `--hidden-units` set to `units`.

    Raises:
        ValueError: when the command has no `--hidden-units VALUE`.
    """
    words = shlex.split(model)
    for i, word in enumerate(words):
        if word == "--hidden-units" and i + 1 < len(words):
            return shlex.join([*words[:i + 1], str(units), *words[i + 2:]])
        if word.startswith("--hidden-units="):
            return shlex.join([*words[:i], f"--hidden-units={units}", *words[i + 1:]])
    raise ValueError(f"--chief-baseline-units needs a model command with --hidden-units; "
                     f"received {model!r}. Add --hidden-units N to --chief-model, or pass "
                     f"--chief-baseline-units 0 to use the bare process's peak.")


def stage_shares(stdout: str) -> dict[int, dict]:
    """Pure function: {task: {"weights", "optimizer", "gradients", "step_peak"}} in bytes,
    from the chief's memory table (`memory_plan.format_rows`)."""
    out = {}
    for line in stdout.splitlines():
        match = _ROW.match(line.strip())
        if not match:
            continue
        amounts = [float(v) * _UNITS[u] for v, u in _AMOUNT.findall(match.group(2))]
        if len(amounts) == 5:  # weights, optimizer, gradients, activations/mb, step peak
            out[int(match.group(1))] = {
                "weights": int(amounts[0]), "optimizer": int(amounts[1]),
                "gradients": int(amounts[2]), "step_peak": int(amounts[4])}
    return out


def verdict(peaks: dict[int, int], shares: dict[int, int], baseline) -> dict:
    """Pure function: the chief's peak against its share + baseline + the stages' excess.

    Args:
        peaks: {task: whole-run peak bytes}; task 0 is the chief.
        shares: {task: its stage's share in bytes}.
        baseline: TensorFlow's baseline in bytes: one number for every task, or
            {task: bytes} (each task's peak with a model of negligible size).

    Returns:
        {"excess": {task: peak - share - baseline}, "allowance_bytes": the largest
        excess of the other tasks (0 when none is above), "bound_bytes": the
        chief's share + baseline + allowance, "met": chief peak <= bound,
        "chief_over_bound_bytes": chief peak - bound}.

    Raises:
        ValueError: when the chief's peak, share or baseline is missing.
    """
    base = baseline if isinstance(baseline, dict) else {t: baseline for t in peaks}
    if 0 not in peaks or 0 not in shares or 0 not in base:
        raise ValueError(f"the chief's (task 0) peak, share and baseline are needed. Received "
                         f"peaks for {sorted(peaks)}, shares for {sorted(shares)}, baselines "
                         f"for {sorted(base)}.")
    excess = {t: peaks[t] - shares[t] - base[t] for t in peaks if t in shares and t in base}
    allowance = max([0] + [e for t, e in excess.items() if t != 0])
    bound = shares[0] + base[0] + allowance
    return {"excess": excess, "allowance_bytes": allowance, "bound_bytes": bound,
            "met": peaks[0] <= bound, "chief_over_bound_bytes": peaks[0] - bound}


def baseline_bytes() -> int:
    """VmHWM of a process that imports TensorFlow and Keras and runs one op."""
    code = (BASELINE_CODE + "\nprint([l.split()[1] for l in open('/proc/self/status') "
            "if l.startswith('VmHWM')][0])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=runs.child_env(), cwd=runs.REPO, timeout=300, check=True)
    return int(proc.stdout.split()[-1]) * 1024


def _job(args, model: str, model_dir: str, epochs: int) -> dict:
    """One launch of P stage processes; each task's VmHWM and what the chief said."""
    train = [*shlex.split(model), "--epochs", str(epochs), "--steps-per-epoch",
             str(args.chief_steps), "--save-every-steps", str(args.chief_save_every_steps),
             "--keep", "1", "--model-dir", model_dir, "--strategy", "pipeline", "--devices",
             "0", "--final-weights", args.chief_final_weights]
    cmd = runs.launch_command(args.chief_stages, "tfdist.train", train, args.timeout)
    load, start = runs.load_average(), time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=runs.REPO, env=runs.child_env())
    with memory.Sampler(proc.pid, args.chief_stages, args.interval) as sampler:
        try:
            out, _ = proc.communicate(timeout=args.timeout + 60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"chief part: job failed (rc={proc.returncode}): "
                           f"{shlex.join(cmd)}\n{out[-3000:]}")
    return {"command": shlex.join(cmd), "s": round(time.monotonic() - start, 1),
            "load_avg_1m": load, "load_avg_1m_end": runs.load_average(),
            "resumed": "resumed from" in out,
            "final_weights": "sharded weights" in out or "model.keras" in out,
            "peak_bytes": {str(t): memory.peaks(s)["hwm_bytes"]
                           for t, s in sorted(sampler.samples.items())},
            "shares": {str(t): v for t, v in stage_shares(out).items()}}


def _two_jobs(args, model: str, name: str) -> dict:
    """The first job and the one resuming it, in one fresh model directory."""
    model_dir = os.path.join(args.out, "runs", name)
    shutil.rmtree(model_dir, ignore_errors=True)
    try:
        jobs = {}
        for job, epochs in (("first", 1), ("resumed", 2)):
            print(f"pipeline-processes: chief {name} {job} job, P={args.chief_stages}",
                  file=sys.stderr, flush=True)
            jobs[job] = _job(args, model, model_dir, epochs)
        return jobs
    finally:
        if not getattr(args, "keep_runs", False):
            shutil.rmtree(model_dir, ignore_errors=True)


def _whole_run_peaks(jobs: dict) -> dict[int, int]:
    """{task: the larger of its two jobs' peaks}."""
    tasks = sorted(int(t) for t in jobs["first"]["peak_bytes"])
    return {t: max(job["peak_bytes"].get(str(t), 0) for job in jobs.values()) for t in tasks}


def median_peaks(runs_: list[dict]) -> dict[int, int]:
    """Pure function: {task: median over the runs of its whole-run peak} (the upper
    median when the count is even)."""
    peaks = [_whole_run_peaks(jobs) for jobs in runs_]
    return {t: statistics.median_high(p[t] for p in peaks if t in p)
            for t in sorted(set().union(*peaks))}


def measure(args) -> dict:
    """The jobs, each task's baseline and the verdict (JSON-able)."""
    if args.chief_repeats < 1:
        raise ValueError(f"--chief-repeats must be at least 1; received {args.chief_repeats}.")
    bare = baseline_bytes()
    units = args.chief_baseline_units
    small = narrowed(args.chief_model, units) if units > 0 else None  # refused before any job
    base_runs, big_runs = [], []
    for _ in range(args.chief_repeats):  # alternated: a load change falls on both alike
        if small:
            base_runs.append(_two_jobs(args, small, "chief_peak_baseline"))
        big_runs.append(_two_jobs(args, args.chief_model, "chief_peak"))
    peaks = median_peaks(big_runs)
    jobs = big_runs[0]
    shares = {int(t): v["step_peak"] for t, v in jobs["first"]["shares"].items()}
    baselines = median_peaks(base_runs) if small else {t: bare for t in peaks}
    bare_check = verdict(peaks, shares, bare)
    return {"model": args.chief_model, "stages": args.chief_stages, "steps": args.chief_steps,
            "save_every_steps": args.chief_save_every_steps, "repeats": args.chief_repeats,
            "final_weights": args.chief_final_weights, "bare_baseline_bytes": bare,
            "baseline_model": small, "baseline_runs": base_runs,
            "baseline_bytes": {str(t): v for t, v in baselines.items()},
            "runs": big_runs, "jobs": jobs, "peak_bytes": {str(t): v for t, v in peaks.items()},
            "share_bytes": {str(t): v for t, v in shares.items()},
            # The issue's words read with the bare process as every task's baseline.
            "over_share_and_bare_baseline_bytes": {str(t): e
                                                   for t, e in bare_check["excess"].items()},
            **{k: ({str(t): e for t, e in v.items()} if k == "excess" else v)
               for k, v in verdict(peaks, shares, baselines).items()}}


def table(c: dict) -> str:
    """Per task: share, baseline, peaks of the two jobs, whole-run peak, excess; the verdict."""
    from tfdist.bench.report import format_table

    rows = []
    for t, peak in c["peak_bytes"].items():
        rows.append([("0 (chief)" if t == "0" else t), c["share_bytes"].get(t, 0) / MIB,
                     c["baseline_bytes"].get(t, 0) / MIB,
                     c["jobs"]["first"]["peak_bytes"].get(t, 0) / MIB,
                     c["jobs"]["resumed"]["peak_bytes"].get(t, 0) / MIB, peak / MIB,
                     c["excess"].get(t, 0) / MIB,
                     c["over_share_and_bare_baseline_bytes"].get(t, 0) / MIB])
    first, again = c["jobs"]["first"], c["jobs"]["resumed"]
    base = (f"each task's baseline: its whole-run peak with {c['baseline_model']!r}"
            if c["baseline_model"] else "every task's baseline: the bare process")
    return (f"chief's whole run: P={c['stages']}, {c['steps']} steps an epoch, a backup every "
            f"{c['save_every_steps']}, final weights {c['final_weights']}; first job "
            f"{first['s']} s (load {first['load_avg_1m']:.1f}), resumed job {again['s']} s "
            f"(load {again['load_avg_1m']:.1f}, resumed: {again['resumed']}); {base}; "
            f"a bare TensorFlow process {c['bare_baseline_bytes'] / MIB:.0f} MiB\n"
            + format_table(["task", "share MiB", "baseline MiB", "run 0: first job",
                            "run 0: resumed job", "whole run (median)", "excess MiB",
                            "over share + bare MiB"], rows)
            + "".join(f"\nrun {i}: whole-run peaks " + ", ".join(
                f"{t}: {v / MIB:.0f}" for t, v in _whole_run_peaks(jobs).items())
                + (" MiB; baseline " + ", ".join(
                    f"{t}: {v / MIB:.0f}" for t, v in _whole_run_peaks(
                        c["baseline_runs"][i]).items()) if c["baseline_runs"] else "")
                for i, jobs in enumerate(c["runs"]))
            + f"\nmedians over {c['repeats']} run(s): chief {c['peak_bytes']['0'] / MIB:.0f} MiB "
            f"<= share + baseline + allowance (the stages' largest excess, {c['allowance_bytes'] / MIB:.0f} MiB) = "
            f"{c['bound_bytes'] / MIB:.0f} MiB: {'met' if c['met'] else 'NOT met'} "
            f"({c['chief_over_bound_bytes'] / MIB:+.0f} MiB)")


def plot(c: dict, ax) -> None:
    """Each task's share + baseline (stacked) beside its two jobs' peaks; the chief's bound."""
    tasks = list(c["peak_bytes"])
    x = range(len(tasks))
    shares = [c["share_bytes"].get(t, 0) / MIB for t in tasks]
    base = [c["baseline_bytes"].get(t, 0) / MIB for t in tasks]
    ax.bar([i - 0.27 for i in x], base, 0.27, color="lightgrey", label="baseline (narrow run)"
           if c["baseline_model"] else "TF baseline")
    ax.bar([i - 0.27 for i in x], shares, 0.27, bottom=base, color="tab:blue",
           label="stage share")
    ax.bar(list(x), [c["jobs"]["first"]["peak_bytes"].get(t, 0) / MIB for t in tasks], 0.27,
           color="tab:orange", label="first job peak")
    ax.bar([i + 0.27 for i in x], [c["jobs"]["resumed"]["peak_bytes"].get(t, 0) / MIB
                                   for t in tasks], 0.27, color="tab:red",
           label="resumed job peak")
    ax.axhline(c["bound_bytes"] / MIB, color="k", ls="--", lw=1,
               label="chief's bound (+ stages' excess)")
    ax.axhline(c["bare_baseline_bytes"] / MIB, color="grey", ls=":", lw=1,
               label="bare TensorFlow process")
    ax.set_xticks(list(x), ["chief" if t == "0" else f"task {t}" for t in tasks])
    ax.set_ylabel("peak RSS MiB")
    ax.set_title(f"chief's whole run, P={c['stages']}: "
                 f"{'met' if c['met'] else 'NOT met'}", fontsize=9)
    ax.legend(fontsize=6, loc="lower right")
