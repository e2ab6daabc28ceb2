"""Starting benchmark processes and reading their results (imports no TensorFlow).

Benchmark workers print one line `TFDIST_BENCH_RESULT {json}`; the launchers
(`tfdist.launch`, `horovodrun`) prefix or interleave other output, so the
first JSON value after the mark is decoded and everything else ignored.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

MARK = "TFDIST_BENCH_RESULT "
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MPI_ROOT_ARGS = "--allow-run-as-root --oversubscribe"
# #40's model larger than any one stage process: 12 Dense 4096x4096 layers (and the
# 64-input first layer), 0.81 GB of weights, 2.4 GB with Adam's slots; 12 equal layers
# split evenly over 2 and 4 stages. The memory benches add their own flags to it.
LARGE_MLP = ("model_parallel_mlp --hidden-layers 13 --hidden-units 4096 --optimizer adam "
             "--global-batch-size 64")


def child_env(extra: dict | None = None, environ: dict | None = None) -> dict:
    """Pure function: the environment of a benchmark's child process.

    Args:
        extra: Variables set last (they win).
        environ: The environment inherited; `os.environ` when None.

    Returns:
        `environ` with TensorFlow quiet, output unbuffered and this checkout
        first on PYTHONPATH, before the inherited PYTHONPATH rather than
        instead of it: clusters set PYTHONPATH (`module load`) for packages
        the children need too.
    """
    environ = dict(os.environ if environ is None else environ)
    inherited = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != REPO]
    return {**environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join([REPO, *inherited]), **(extra or {})}


def emit(result: dict) -> None:
    """Prints a worker's result line (call on one rank only unless all are wanted)."""
    print(MARK + json.dumps(result), flush=True)


def parse(stdout: str) -> list[dict]:
    """Pure function: every result line's JSON, in output order."""
    out = []
    for line in stdout.splitlines():
        if MARK in line:
            out.append(json.JSONDecoder().raw_decode(line.split(MARK, 1)[1].strip())[0])
    return out


def horovod_venv(explicit: str | None = None) -> str | None:
    """The Horovod venv (argument, else `cluster.horovod.venv_path`) if it has horovodrun."""
    from tfdist.cluster.horovod import venv_path

    venv = explicit or venv_path(os.environ)
    return venv if os.access(os.path.join(venv, "bin", "horovodrun"), os.X_OK) else None


CPU_BIND = ("none", "cores")


def _check_bind(cpu_bind: str) -> None:
    if cpu_bind not in CPU_BIND:
        raise ValueError(f"cpu_bind must be one of {list(CPU_BIND)}. Received: {cpu_bind!r}.")


def launch_command(workers: int, module: str, args: list[str], timeout_s: float,
                   cpu_bind: str = "none", share: str | None = None) -> list[str]:
    """Pure function: `python -m tfdist.launch -n N [--cpu-bind cores] -- python -m MODULE ARGS`.

    `share="I/N"` runs MODULE under `tfdist.bench.bind --share I/N`: on the
    share of the cores worker I of N would get (e.g. a 1-worker baseline
    bound as worker 0 of a bound N-worker run).
    """
    _check_bind(cpu_bind)
    bind = ["--cpu-bind", cpu_bind] if cpu_bind != "none" else []
    wrap = [sys.executable, "-m", "tfdist.bench.bind", "--share", share, "--"] if share else []
    return [sys.executable, "-m", "tfdist.launch", "-n", str(workers), "--timeout",
            f"{timeout_s:g}", *bind, "--", *wrap, sys.executable, "-m", module, *args]


def horovod_command(venv: str, ranks: int, controller: str, module: str, args: list[str],
                    mpi_args: str = "", cpu_bind: str = "none") -> list[str]:
    """Pure function: `horovodrun -np N -H localhost:N --gloo|--mpi VENV/python -m MODULE ARGS`.

    With `cpu_bind="cores"` each rank runs under `tfdist.bench.bind`, which
    gives it the share of the cores `tfdist.launch --cpu-bind cores` would.
    """
    if controller not in ("gloo", "mpi"):
        raise ValueError(f"controller must be 'gloo' or 'mpi'. Received: {controller!r}.")
    _check_bind(cpu_bind)
    python = os.path.join(venv, "bin", "python")
    cmd = [os.path.join(venv, "bin", "horovodrun"), "-np", str(ranks), "-H",
           f"localhost:{ranks}", f"--{controller}"]
    if controller == "mpi":
        cmd.append(f"--mpi-args={MPI_ROOT_ARGS} {mpi_args}".strip())
    bind = [python, "-m", "tfdist.bench.bind", "--"] if cpu_bind == "cores" else []
    return cmd + [*bind, python, "-m", module, *args]


def run(cmd: list[str], timeout_s: float, env: dict | None = None,
        what: str = "benchmark") -> list[dict]:
    """Runs `cmd` from the repository root; returns its result lines.

    Raises:
        RuntimeError: when it fails or prints no result, with its output's tail.
    """
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                          env=child_env(env), cwd=REPO)
    results = parse(proc.stdout)
    if proc.returncode != 0 or not results:
        raise RuntimeError(f"{what} failed (rc={proc.returncode}): {' '.join(cmd)}\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return results


def start_and_wait(starts: list, timeout_s: float) -> tuple[list, list[str]]:
    """Starts processes together, waits for all; returns (processes, their outputs).

    Each of `starts` is called with an open temporary file for the process's
    output (a file, not a pipe, so that no process stalls on a full pipe
    while another is read) and returns the `Popen`. When one fails or the
    time runs out, the others are killed.
    """
    procs, outs = [], []
    try:
        for start in starts:
            out = tempfile.TemporaryFile(mode="w+")
            outs.append(out)
            procs.append(start(out))
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    texts = []
    for out in outs:
        out.seek(0)
        texts.append(out.read())
        out.close()
    return procs, texts


def run_together(cmds: list[list[str]], timeout_s: float, env: dict | None = None,
                 what: str = "benchmark") -> list[list[dict]]:
    """Starts every command at once, waits for all; returns each one's result lines.

    Their output goes to files, not pipes, so that no process stalls on a full
    pipe while another is read. When one fails or the time runs out, the
    others are killed.

    Raises:
        RuntimeError: when any fails or prints no result, with its output's tail.
    """
    procs, texts = start_and_wait(
        [lambda out, cmd=cmd: subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                               text=True, env=child_env(env), cwd=REPO,
                                               stdin=subprocess.DEVNULL) for cmd in cmds],
        timeout_s)
    results = [parse(t) for t in texts]
    if any(p.returncode != 0 for p in procs) or not all(results):
        raise RuntimeError(
            f"{what} failed (exit codes {[p.returncode for p in procs]}):\n" + "\n".join(
                f"--- {' '.join(c)}\n{t[-2000:]}" for c, t in zip(cmds, texts)))
    return results


@contextlib.contextmanager
def model_dir(out: str, label: str, keep: bool = False):
    """OUT/runs/LABEL, the model dir of one benchmark run, removed after it unless `keep`.

    A run's model.keras and backups are of no use to a benchmark once its
    result line is read (a synthetic_cnn scaling point left 30 MB), so they go
    with the run; `--keep-runs` keeps them to look into. OUT/runs goes too
    once empty.
    """
    root = os.path.join(os.path.abspath(out), "runs")
    path = os.path.join(root, label)
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.rmdir(root)  # only when empty: other runs' dirs, or kept ones, stay


def say(line: str) -> None:
    """A progress line of a running benchmark, on stderr (stdout keeps the table)."""
    print(line, file=sys.stderr, flush=True)


def load_average() -> float:
    """The 1-minute load average, recorded next to every figure."""
    return os.getloadavg()[0]
