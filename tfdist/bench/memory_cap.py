"""`memory-cap`: a model larger than any one process, trained by stage processes (#40)
or by data-parallel workers at `--shard parameters` (#51), each process inside a
kernel memory cap.

Real jobs of MODEL (13 Dense 4096x4096 + Adam), every process in a cgroup v1
memory group of its own capped at --limit-mib (`tfdist.bench.capped`):

- one: the model in one process (`--strategy single`) under the cap: it is killed
  by the kernel, which shows the cap is real; with `--shard LEVEL`, also the same
  workers at `--control-shard` (default optimizer: every worker holds every
  weight and gradient), killed by the same cap;
- whole: P stage processes (or, with `--shard`, P shm workers at that level)
  train, back up and write the final weights as model.json + Keras's sharded
  weights;
- interrupted: the same run, one process SIGKILLed once the first backup
  exists, then the same command again: it resumes and ends.

Reported: each process's peak RSS and OOM kills, and the largest difference of
the two runs' final weights, loaded with Keras alone, against rtol 1e-5.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time

from tfdist.bench import runs

DESCRIPTION = ("stage processes each in a kernel memory cap: train, back up, lose a stage, "
               "resume, write final weights")
MODEL = runs.LARGE_MLP + " --learning-rate 0.001 --seed 0 --deterministic --verbose 0"


def add_arguments(parser):
    """Flags of this benchmark."""
    parser.add_argument("--limit-mib", type=float, default=1900,
                        help="each process's cap (one process of MODEL peaks near 3600 MiB)")
    parser.add_argument("--stages", type=int, default=4, help="stage processes")
    parser.add_argument("--steps", type=int, default=6, help="training steps (one epoch)")
    parser.add_argument("--save-every-steps", type=int, default=2)
    parser.add_argument("--model", default=MODEL, help="RECIPE [--key value ...]")
    parser.add_argument("--shard", default=None,
                        help="run P shm data-parallel workers at this --shard level instead of "
                             "stage processes (e.g. parameters)")
    parser.add_argument("--control-shard", default="optimizer",
                        help="with --shard: the level whose workers the cap must kill")


def _train(args, model_dir: str) -> list[str]:
    return [*args.model.split(), "--epochs", "1", "--steps-per-epoch", str(args.steps),
            "--save-every-steps", str(args.save_every_steps), "--model-dir", model_dir]


def _capped(args, report: str) -> list[str]:
    return [sys.executable, "-m", "tfdist.bench.capped", str(args.limit_mib), "--report",
            report, "--"]


def _layout(args, shard: str | None) -> list[str]:
    """How the P processes split the model: pipeline stages, or shm workers at `shard`."""
    if shard:
        return ["--strategy", "shm", "--shard", shard, "--final-weights", "sharded"]
    return ["--strategy", "pipeline", "--devices", "0", "--final-weights", "sharded"]


def _stages(args, model_dir: str, reports: str, kill_after_backup: bool = False,
            shard: str | None = None) -> dict:
    """One capped job of P processes; SIGKILLs process P-1's trainer once a backup exists."""
    os.makedirs(reports, exist_ok=True)
    command = [sys.executable, "-m", "tfdist.launch", "-n", str(args.stages), "--timeout",
               "900", "--", *_capped(args, os.path.join(reports, "task{task}.json")),
               sys.executable, "-m", "tfdist.train", *_train(args, model_dir),
               *_layout(args, shard)]
    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, killed, victim = [], [], f"[worker {args.stages - 1}] capped: pid "

    def kill_once_backed_up():  # the first backup's index, then SIGKILL the stage's trainer
        while proc.poll() is None:
            pids = [int(line[len(victim):].split()[0]) for line in list(out)
                    if line.startswith(victim)]
            if pids and glob.glob(os.path.join(model_dir, "backup", "ckpt-*.npz")):
                os.kill(pids[0], signal.SIGKILL)
                killed.append(f"stage {args.stages - 1} (pid {pids[0]}) after the first backup")
                return
            time.sleep(0.2)

    if kill_after_backup:
        threading.Thread(target=kill_once_backed_up, daemon=True).start()
    for line in proc.stdout:
        out.append(line)
    proc.wait()
    tasks = []
    for path in sorted(glob.glob(os.path.join(reports, "task*.json"))):
        with open(path) as f:
            tasks.append(json.load(f))
        os.remove(path)
    return {"exit": proc.returncode, "s": round(time.monotonic() - start, 1),
            "killed": killed[0] if killed else None,
            "tasks": tasks, "resumed": any("resumed from" in line for line in out),
            "tail": "".join(line for line in out if "tfdist" in line or "capped" in line
                            or "Error" in line)[-3000:]}


def _weights(model_dir: str) -> str:
    """The final weights, loaded with Keras alone, as an .npz beside them."""
    path = os.path.join(model_dir, "final.npz")
    script = ("import sys, keras, numpy as np; d = sys.argv[1]; "
              "m = keras.models.model_from_json(open(d + '/model.json').read()); "
              "m.load_weights(d + '/model.weights.json'); "
              "np.savez(d + '/final.npz', *m.get_weights())")
    subprocess.run([sys.executable, "-c", script, model_dir], check=True)
    return path


def run(args) -> dict:
    """Runs the three jobs; returns the JSON-able result."""
    import numpy as np

    root = os.path.join(args.out, "runs", "memory_cap")
    os.makedirs(root, exist_ok=True)
    one_report = os.path.join(root, "one.json")
    one = subprocess.run([*_capped(args, one_report), sys.executable, "-m", "tfdist.train",
                          *_train(args, os.path.join(root, "one")), "--strategy", "single"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(one_report) as f:
        result = {"limit_mib": args.limit_mib, "stages": args.stages,
                  "one": {"exit": one.returncode, **json.load(f)}}
    shard = getattr(args, "shard", None)
    result["shard"] = shard
    if shard:  # the same workers at the control level: the cap must kill them
        result["control"] = {"shard": args.control_shard, **_stages(
            args, os.path.join(root, "control"), os.path.join(root, "r0"),
            shard=args.control_shard)}
    result["whole"] = _stages(args, os.path.join(root, "whole"), os.path.join(root, "r1"),
                              shard=shard)
    first = _stages(args, os.path.join(root, "cut"), os.path.join(root, "r2"),
                    kill_after_backup=True, shard=shard)
    again = _stages(args, os.path.join(root, "cut"), os.path.join(root, "r3"), shard=shard)
    result["interrupted"], result["resumed"] = first, again
    if result["whole"]["exit"] == 0 and again["exit"] == 0:
        a = np.load(_weights(os.path.join(root, "whole")))
        b = np.load(_weights(os.path.join(root, "cut")))
        worst = 0.0
        for k in a.files:
            allowance = 1e-5 * np.abs(a[k]) + 1e-6
            worst = max(worst, float((np.abs(a[k] - b[k]) / allowance).max()))
        result["final_weights_worst_allowance"] = worst
    return result


def table(result) -> str:
    """Each job's processes: exit, peak RSS, OOM kills."""
    shard = result.get("shard")
    what = f"{result['stages']} shm workers at --shard {shard}" if shard else \
        f"{result['stages']} stages"
    lines = [f"cap {result['limit_mib']:.0f} MiB per process, {what}",
             f"one process: exit {result['one']['exit']}, peak RSS "
             f"{result['one']['rss_peak_mib']:.0f} MiB, oom kills {result['one']['oom_kills']}"]
    if "control" in result:
        job = result["control"]
        tasks = ", ".join(f"{t['rss_peak_mib']:.0f}" for t in job["tasks"])
        lines.append(f"control (--shard {job['shard']}): exit {job['exit']} in {job['s']} s, "
                     f"peak RSS per worker [{tasks}] MiB, oom kills "
                     f"{sum(t['oom_kills'] for t in job['tasks'])}")
    for name in ("whole", "interrupted", "resumed"):
        job = result[name]
        tasks = ", ".join(f"{t['rss_peak_mib']:.0f}" for t in job["tasks"])
        lines.append(f"{name}: exit {job['exit']} in {job['s']} s, peak RSS per task [{tasks}] "
                     f"MiB, oom kills {sum(t['oom_kills'] for t in job['tasks'])}"
                     + (f", killed {job['killed']}" if job["killed"] else "")
                     + (", resumed" if job["resumed"] else ""))
    if "final_weights_worst_allowance" in result:
        lines.append("final weights (Keras alone), interrupted vs whole: worst "
                     f"{result['final_weights_worst_allowance']:.3f} allowances of rtol 1e-5")
    return "\n".join(lines)


def plot(result, fig):
    """Each process's peak RSS against the cap."""
    ax = fig.subplots()
    jobs = [j for j in ("control", "whole", "interrupted", "resumed") if j in result]
    names = ["one"] + [f"{job} t{i}" for job in jobs for i in range(len(result[job]["tasks"]))]
    peaks = [result["one"]["rss_peak_mib"]] + [t["rss_peak_mib"] for job in jobs
                                               for t in result[job]["tasks"]]
    ax.bar(range(len(peaks)), peaks)
    ax.axhline(result["limit_mib"], color="red", label="cap")
    ax.set_xticks(range(len(peaks)), names, rotation=90)
    ax.set_ylabel("peak RSS (MiB)")
    ax.legend()
