"""`python -m tfdist.bench signals`: SIGTERM and Ctrl-C at random moments, under load.

Each trial starts a fresh run (`single`: one `python -m tfdist.train`;
`launch`: `python -m tfdist.launch -n 2 -- ... --strategy multi_worker`),
sends one signal after a delay drawn uniformly from [0, the run's duration]
(measured first, uninterrupted, under the same load), so start-up, training,
evaluation and the final save are all hit in proportion to their length, and
waits for it to end. SIGTERM goes to the started process only, as a
scheduler's does; SIGINT to its whole process group, as a terminal's Ctrl-C
does. A trial passes when the run exits 75 (SIGTERM) or 130 (SIGINT), its
`--status-file` says the same, a backup is there, no C++ abort
(`terminate called`) or Python traceback was printed, and the same command
rerun exits 0 with the final model. A signal sent after the run wrote its
status file (its last act before the interpreter's teardown, a second or two
here) finds the run finished: there exit 0 with status 0 is the right outcome
(docs/fault_tolerance.md); such an attempt, and one whose run ended before its
moment, is kept as `missed` and the signal drawn again (`run`). `--load` runs a
second training job beside the trials all along (`digits_mlp --epochs 50`,
restarted when done).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from tfdist.bench import report, runs

DESCRIPTION = ("SIGTERM and Ctrl-C at random moments (single and launch -n 2 multi_worker), "
               "under a second job's load: exit status, backup, status file, rerun")
EXPECTED = {"SIGTERM": 75, "SIGINT": 130}
ABORT_MARKS = ("terminate called", "Traceback (most recent call last)", "core dumped")


def add_arguments(parser) -> None:
    """Flags of this benchmark."""
    parser.add_argument("--sigterms", type=int, default=20, help="SIGTERM trials")
    parser.add_argument("--sigints", type=int, default=10, help="Ctrl-C (SIGINT) trials")
    parser.add_argument("--modes", default="single,launch",
                        help="comma-separated: single, launch (trials alternate between them)")
    parser.add_argument("--recipe", default="digits_mlp")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--load", action=argparse.BooleanOptionalAction, default=True,
                        help="run a second training job beside the trials (default: yes)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per run")


def command(mode: str, recipe: str, epochs: int, model_dir: str) -> list[str]:
    """Pure function: the trial's command line."""
    train = ["-m", "tfdist.train", recipe, "--epochs", str(epochs), "--model-dir", model_dir,
             "--status-file", os.path.join(model_dir, "status"), "--verbose", "0"]
    if mode == "single":
        return [sys.executable, *train]
    return [sys.executable, "-m", "tfdist.launch", "-n", "2", "--", sys.executable, *train,
            "--strategy", "multi_worker"]


def classify(name: str, code: int, status: str | None, backups: list[str], output: str,
             rerun_code: int | None, late: bool = False) -> list[str]:
    """Pure function: what is wrong with a trial (empty: it passed).

    Args:
        late: The run had finished before the signal (it had written its status
            file, or ended before the signal was sent): exit 0 and status 0 are
            expected.
    """
    want = 0 if late else EXPECTED[name]
    wrong = []
    if code != want:
        wrong.append(f"exit {code}, not {want}")
    if status != str(want):
        wrong.append(f"status file {status!r}")
    if not backups:
        wrong.append("no backup")
    wrong += [f"printed {m!r}" for m in ABORT_MARKS if m in output]
    if rerun_code != 0:
        wrong.append(f"rerun exit {rerun_code}")
    return wrong


class _Load:
    """A second training job, restarted whenever it ends, until `stop()`."""

    def __init__(self, recipe: str, root: str):
        self.recipe, self.root, self.proc, self.stopped = recipe, root, None, False
        self.next()

    def next(self) -> None:
        if self.stopped:
            return
        if self.proc is None or self.proc.poll() is not None:
            d = os.path.join(self.root, "load")
            shutil.rmtree(d, ignore_errors=True)
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tfdist.train", self.recipe, "--epochs", "50",
                 "--model-dir", d, "--verbose", "0"], env=runs.child_env(),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def stop(self) -> None:
        self.stopped = True
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _run(cmd, timeout_s, load, signal_after=None, signum=None):
    """(exit status, output, seconds, when the signal was sent or None) of `cmd`,
    signalled once after `signal_after` s."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=runs.child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    sent = None  # when the signal went, by the wall clock
    chunks = []
    reader = threading.Thread(target=lambda: chunks.append(proc.stdout.read()), daemon=True)
    reader.start()
    while proc.poll() is None:
        now = time.monotonic() - started
        if signal_after is not None and sent is None and now >= signal_after:
            sent = time.time()
            if signum == signal.SIGINT:
                os.killpg(proc.pid, signum)  # a terminal's Ctrl-C: the whole foreground group
            else:
                proc.send_signal(signum)  # a scheduler's SIGTERM: the job's process
        if now > timeout_s:
            os.killpg(proc.pid, signal.SIGKILL)
        if load is not None:
            load.next()
        time.sleep(0.01)
    reader.join(timeout=10)
    return proc.returncode, "".join(chunks), time.monotonic() - started, sent


ATTEMPTS = 4  # runs per planned signal before giving up on landing it inside the run


def run(args) -> dict:
    """Measures; returns the trials and their summary.

    Each planned signal is sent at a moment drawn from [0, the uninterrupted run's
    time to its status file]. Under a changing load a run can end (or write its
    status) before its moment; that attempt is kept as `missed`, checked all the
    same (a finished run exits 0), and the signal is drawn again, up to ATTEMPTS
    runs, so that the trials counted are signals that landed while the run ran.
    """
    rng = random.Random(args.seed)
    modes = [m for m in args.modes.split(",") if m]
    root = tempfile.mkdtemp(prefix="tfdist-signals-", dir=args.out if os.path.isdir(args.out)
                            else None)
    load = _Load(args.recipe, root) if args.load else None
    trials, missed, durations = [], [], {}
    try:
        for mode in modes:  # the uninterrupted time to the status file, under the same load
            d = os.path.join(root, f"plain-{mode}")
            began = time.time()
            code, out, took, _ = _run(command(mode, args.recipe, args.epochs, d),
                                      args.timeout_s, load)
            if code != 0:
                raise RuntimeError(f"the uninterrupted {mode} run failed ({code}):\n{out[-3000:]}")
            durations[mode] = os.path.getmtime(os.path.join(d, "status")) - began
            runs.say(f"signals: uninterrupted {mode} run {took:.1f} s, its status file at "
                     f"{durations[mode]:.1f} s (load {runs.load_average():.1f})")
            shutil.rmtree(d, ignore_errors=True)
        plan = ["SIGTERM"] * args.sigterms + ["SIGINT"] * args.sigints
        for i, name in enumerate(plan):
            mode = modes[i % len(modes)]
            for attempt in range(ATTEMPTS):
                d = os.path.join(root, f"trial-{i}-{attempt}")
                t = _trial(command(mode, args.recipe, args.epochs, d), d, name,
                           rng.uniform(0.0, durations[mode]), args.timeout_s, load)
                t.update(mode=mode, attempt=attempt)
                landed = t["sent"] and not t["late"]
                (trials if landed else missed).append(t)
                what = ("" if landed else " (missed: the run had finished; drawn again)"
                        if t["sent"] else " (missed: the run ended first; drawn again)")
                runs.say(f"signals: {i + 1}/{len(plan)} {mode} {name} at {t['after_s']:.1f} s"
                         f"{what}: exit {t['exit']}, status {t['status_file']}, "
                         f"{t['backups'][-1] if t['backups'] else 'no backup'}, rerun "
                         f"{t['rerun_exit']}"
                         f"{'' if t['ok'] else ' WRONG: ' + '; '.join(t['wrong'])}")
                if t["ok"]:
                    shutil.rmtree(d, ignore_errors=True)
                if landed:
                    break
    finally:
        if load is not None:
            load.stop()
        if all(t["ok"] for t in trials + missed):
            shutil.rmtree(root, ignore_errors=True)
    summary = {}
    for t in trials + missed:
        s = summary.setdefault(f"{t['mode']} {t['signal']}",
                               {"trials": 0, "ok": 0, "missed": 0, "missed_ok": 0})
        landed = t in trials
        s["trials" if landed else "missed"] += 1
        s["ok" if landed else "missed_ok"] += t["ok"]
    return {"recipe": args.recipe, "epochs": args.epochs, "load_job": bool(args.load),
            "status_file_at_s": durations, "trials": trials, "missed": missed,
            "summary": summary, "all_ok": all(t["ok"] for t in trials + missed),
            "planned": len(plan), "landed": len(trials),
            "kept": root if os.path.isdir(root) else None}


def _trial(cmd, d, name, after, timeout_s, load) -> dict:
    """One run signalled with `name` after `after` s, its rerun, and the verdict."""
    load_avg = runs.load_average()
    code, out, took, sent = _run(cmd, timeout_s, load, after, getattr(signal, name))
    status_path = os.path.join(d, "status")
    status = open(status_path).read().strip() if os.path.exists(status_path) else None
    # The status file is the run's last word: one written before the signal went means
    # the run had finished (the signal hit the interpreter's teardown).
    late = sent is not None and status is not None and os.path.getmtime(status_path) < sent
    backup_dir = os.path.join(d, "backup")
    backups = sorted(os.listdir(backup_dir)) if os.path.isdir(backup_dir) else []
    rerun_code, _, _, _ = _run(cmd, timeout_s, load)
    # A run that ended before the signal finished as an unsignalled one: exit 0.
    wrong = classify(name, code, status, backups, out, rerun_code, late or sent is None)
    last = [line for line in out.splitlines() if "tfdist:" in line][-1:]
    return {"signal": name, "after_s": round(after, 2), "sent": sent is not None,
            "late": late, "exit": code, "status_file": status, "backups": backups[-1:],
            "rerun_exit": rerun_code, "ok": not wrong, "wrong": wrong,
            "load": round(load_avg, 1), "took_s": round(took, 1),
            "last_line": last[0][-200:] if last else "",
            "output_tail": "" if not wrong else out[-2000:]}


def table(result) -> str:
    """Readable summary."""
    rows = [[k, v["trials"], v["ok"], v["missed"], v["missed_ok"]]
            for k, v in sorted(result["summary"].items())]
    lines = [report.format_table(["signals", "landed", "ok", "missed", "missed ok"], rows)]
    lines += [f"  {t['mode']} {t['signal']} at {t['after_s']} s: {'; '.join(t['wrong'])}"
              for t in result["trials"] + result["missed"] if not t["ok"]]
    return "\n".join(lines)


def plot(result, fig) -> None:
    """Each trial's signal time against its outcome."""
    ax = fig.add_subplot(1, 1, 1)
    for i, t in enumerate(result["trials"] + result["missed"]):
        ax.scatter(t["after_s"], i, marker=("o" if t["ok"] else "x") if t in result["trials"]
                   else ".", color="tab:green" if t["ok"] else "tab:red")
    ax.set_xlabel("signal sent after (s)")
    ax.set_ylabel("trial")
    ax.set_title("signals: o = exit 75/130 with backup, status file and a finished rerun"
                 " (. missed: the run had finished)")
