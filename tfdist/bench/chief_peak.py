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
slots, gradients and activations in flight: `memory_plan`); TensorFlow's
baseline is a process that imports TensorFlow and Keras and runs one op,
building nothing of the model (`BASELINE_CODE`). What a stage process holds
beyond share + baseline (the update's temporaries, the runtime's buffers) is
its excess; the allowance is the largest excess of the tasks that only serve
their stage (not the chief), so the verdict, chief peak <= its share +
baseline + allowance, says the chief holds no more for driving the run,
backing it up, resuming it and writing its final weights than any stage holds
for its own part.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time

from tfdist.bench import memory, runs

MODEL = ("model_parallel_mlp --hidden-layers 13 --hidden-units 4096 --optimizer adam "
         "--global-batch-size 64 --learning-rate 0.001 --seed 0 --verbose 0")
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


def verdict(peaks: dict[int, int], shares: dict[int, int], baseline: int) -> dict:
    """Pure function: the chief's peak against its share + baseline + the stages' excess.

    Args:
        peaks: {task: whole-run peak bytes}; task 0 is the chief.
        shares: {task: its stage's share in bytes}.
        baseline: TensorFlow's baseline in bytes.

    Returns:
        {"excess": {task: peak - share - baseline}, "allowance_bytes": the largest
        excess of the other tasks (0 when none is above), "bound_bytes": the
        chief's share + baseline + allowance, "met": chief peak <= bound,
        "chief_over_bound_bytes": chief peak - bound}.

    Raises:
        ValueError: when the chief's peak or share is missing.
    """
    if 0 not in peaks or 0 not in shares:
        raise ValueError(f"the chief's (task 0) peak and share are needed. Received peaks for "
                         f"{sorted(peaks)}, shares for {sorted(shares)}.")
    excess = {t: peaks[t] - shares[t] - baseline for t in peaks if t in shares}
    allowance = max([0] + [e for t, e in excess.items() if t != 0])
    bound = shares[0] + baseline + allowance
    return {"excess": excess, "allowance_bytes": allowance, "bound_bytes": bound,
            "met": peaks[0] <= bound, "chief_over_bound_bytes": peaks[0] - bound}


def baseline_bytes() -> int:
    """VmHWM of a process that imports TensorFlow and Keras and runs one op."""
    code = (BASELINE_CODE + "\nprint([l.split()[1] for l in open('/proc/self/status') "
            "if l.startswith('VmHWM')][0])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=runs.child_env(), cwd=runs.REPO, timeout=300, check=True)
    return int(proc.stdout.split()[-1]) * 1024


def _job(args, model_dir: str, epochs: int) -> dict:
    """One launch of P stage processes; each task's VmHWM and what the chief said."""
    train = [*shlex.split(args.chief_model), "--epochs", str(epochs), "--steps-per-epoch",
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


def measure(args) -> dict:
    """The two jobs, the baseline and the verdict (JSON-able)."""
    model_dir = os.path.join(args.out, "runs", "chief_peak")
    shutil.rmtree(model_dir, ignore_errors=True)
    baseline = baseline_bytes()
    try:
        jobs = {}
        for name, epochs in (("first", 1), ("resumed", 2)):
            print(f"pipeline-processes: chief {name} job, P={args.chief_stages}",
                  file=sys.stderr, flush=True)
            jobs[name] = _job(args, model_dir, epochs)
    finally:
        if not getattr(args, "keep_runs", False):
            shutil.rmtree(model_dir, ignore_errors=True)
    tasks = sorted(int(t) for t in jobs["first"]["peak_bytes"])
    peaks = {t: max(job["peak_bytes"].get(str(t), 0) for job in jobs.values()) for t in tasks}
    shares = {int(t): v["step_peak"] for t, v in jobs["first"]["shares"].items()}
    return {"model": args.chief_model, "stages": args.chief_stages, "steps": args.chief_steps,
            "save_every_steps": args.chief_save_every_steps,
            "final_weights": args.chief_final_weights, "baseline_bytes": baseline,
            "jobs": jobs, "peak_bytes": {str(t): v for t, v in peaks.items()},
            "share_bytes": {str(t): v for t, v in shares.items()},
            **{k: ({str(t): e for t, e in v.items()} if k == "excess" else v)
               for k, v in verdict(peaks, shares, baseline).items()}}


def table(c: dict) -> str:
    """Per task: share, peaks of the two jobs, whole-run peak, excess; then the verdict."""
    from tfdist.bench.report import format_table

    rows = []
    for t, peak in c["peak_bytes"].items():
        rows.append([("0 (chief)" if t == "0" else t), c["share_bytes"].get(t, 0) / MIB,
                     c["jobs"]["first"]["peak_bytes"].get(t, 0) / MIB,
                     c["jobs"]["resumed"]["peak_bytes"].get(t, 0) / MIB, peak / MIB,
                     c["excess"].get(t, 0) / MIB])
    first, again = c["jobs"]["first"], c["jobs"]["resumed"]
    return (f"chief's whole run: P={c['stages']}, {c['steps']} steps an epoch, a backup every "
            f"{c['save_every_steps']}, final weights {c['final_weights']}; first job "
            f"{first['s']} s (load {first['load_avg_1m']:.1f}), resumed job {again['s']} s "
            f"(load {again['load_avg_1m']:.1f}, resumed: {again['resumed']}); TensorFlow's "
            f"baseline {c['baseline_bytes'] / MIB:.0f} MiB\n"
            + format_table(["task", "share MiB", "first job peak", "resumed job peak",
                            "whole run peak", "excess MiB"], rows)
            + f"\nchief {c['peak_bytes']['0'] / MIB:.0f} MiB <= share + baseline + allowance "
            f"(the stages' largest excess, {c['allowance_bytes'] / MIB:.0f} MiB) = "
            f"{c['bound_bytes'] / MIB:.0f} MiB: {'met' if c['met'] else 'NOT met'} "
            f"({c['chief_over_bound_bytes'] / MIB:+.0f} MiB)")


def plot(c: dict, ax) -> None:
    """Each task's share + baseline (stacked) beside its two jobs' peaks; the chief's bound."""
    tasks = list(c["peak_bytes"])
    x = range(len(tasks))
    shares = [c["share_bytes"].get(t, 0) / MIB for t in tasks]
    base = c["baseline_bytes"] / MIB
    ax.bar([i - 0.27 for i in x], [base] * len(tasks), 0.27, color="lightgrey",
           label="TF baseline")
    ax.bar([i - 0.27 for i in x], shares, 0.27, bottom=[base] * len(tasks), color="tab:blue",
           label="stage share")
    ax.bar(list(x), [c["jobs"]["first"]["peak_bytes"].get(t, 0) / MIB for t in tasks], 0.27,
           color="tab:orange", label="first job peak")
    ax.bar([i + 0.27 for i in x], [c["jobs"]["resumed"]["peak_bytes"].get(t, 0) / MIB
                                   for t in tasks], 0.27, color="tab:red",
           label="resumed job peak")
    ax.axhline(c["bound_bytes"] / MIB, color="k", ls="--", lw=1,
               label="chief's bound (+ stages' excess)")
    ax.set_xticks(list(x), ["chief" if t == "0" else f"task {t}" for t in tasks])
    ax.set_ylabel("peak RSS MiB")
    ax.set_title(f"chief's whole run, P={c['stages']}: "
                 f"{'met' if c['met'] else 'NOT met'}", fontsize=9)
    ax.legend(fontsize=6, loc="lower right")
