"""`horovod-allreduce`: Horovod all-reduce bandwidth, Gloo vs MPI, side by side.

Starts `horovodrun -np N -H localhost:N` once with `--gloo` and once with
`--mpi` from the Horovod venv (scripts/install_horovod.sh); each rank times
`hvd.allreduce` (sum, float32) of several message sizes. Reports algorithm
bandwidth (bytes / time) and bus bandwidth, busbw = algbw * 2(N-1)/N
(nccl-tests' convention). This module imports no TensorFlow; the ranks do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tfdist.bench.runs import child_env

DESCRIPTION = "Horovod all-reduce bandwidth: Gloo vs MPI (needs the Horovod venv)"
CONTROLLERS = ("gloo", "mpi")
MARK = "TFDIST_BENCH_RESULT "


def add_arguments(parser):
    parser.add_argument("--venv", default=None,
                        help="Horovod venv (default: $TFDIST_HOROVOD_VENV or "
                             "~/.cache/tfdist/horovod-venv)")
    parser.add_argument("-n", "--ranks", type=int, default=2, help="ranks on this host")
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1.0, 19.0, 64.0],
                        help="message sizes in MB (19 MB: a 4.7M-parameter model's gradients)")
    parser.add_argument("--iters", type=int, default=10, help="timed all-reduces per size")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per horovodrun")


def bus_bandwidth(algbw: float, ranks: int) -> float:
    """Pure function: nccl-tests' bus bandwidth of an all-reduce."""
    return algbw * 2 * (ranks - 1) / ranks if ranks > 1 else algbw


def _run_controller(venv, controller, args) -> dict:
    cmd = [os.path.join(venv, "bin", "horovodrun"), "-np", str(args.ranks), "-H",
           f"localhost:{args.ranks}", f"--{controller}"]
    if controller == "mpi":
        cmd.append("--mpi-args=--allow-run-as-root --oversubscribe")
    cmd += [os.path.join(venv, "bin", "python"), "-m", "tfdist.bench.horovod_allreduce",
            "--worker", json.dumps({"sizes_mb": args.sizes_mb, "iters": args.iters})]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                          env=child_env())
    lines = [line.split(MARK, 1)[1] for line in proc.stdout.splitlines() if MARK in line]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"horovodrun --{controller} failed (rc={proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    # horovodrun may glue other output onto the line: decode the first JSON value only.
    return json.JSONDecoder().raw_decode(lines[0].strip())[0]


def run(args) -> dict:
    from tfdist.bench import runs
    from tfdist.cluster.horovod import venv_path

    venv = runs.horovod_venv(args.venv)
    if venv is None:
        raise SystemExit(f"error: no Horovod venv (with bin/horovodrun) at "
                         f"{args.venv or venv_path(os.environ)}. "
                         "HINT: run scripts/install_horovod.sh")
    results = {}
    for controller in CONTROLLERS:
        timings = _run_controller(venv, controller, args)
        results[controller] = [
            {"size_mb": mb, "seconds": s, "algbw_gbs": mb * 1e6 / s / 1e9,
             "busbw_gbs": bus_bandwidth(mb * 1e6 / s / 1e9, args.ranks)}
            for mb, s in zip(args.sizes_mb, timings["seconds"])]
    return {"ranks": args.ranks, "iters": args.iters, "results": results,
            "note": "all ranks on one host; median seconds per all-reduce"}


def table(result) -> str:
    rows = [f"Horovod all-reduce, {result['ranks']} ranks on one host (busbw GB/s)",
            f"{'size MB':>8} " + " ".join(f"{c:>8}" for c in CONTROLLERS)]
    sizes = [r["size_mb"] for r in result["results"][CONTROLLERS[0]]]
    for i, mb in enumerate(sizes):
        rows.append(f"{mb:>8g} " + " ".join(
            f"{result['results'][c][i]['busbw_gbs']:>8.3f}" for c in CONTROLLERS))
    return "\n".join(rows)


def plot(result, fig):
    ax = fig.add_subplot(111)
    for c in CONTROLLERS:
        rows = result["results"][c]
        ax.plot([r["size_mb"] for r in rows], [r["busbw_gbs"] for r in rows], "o-", label=c)
    ax.set_xscale("log")
    ax.set_xlabel("message size (MB)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"Horovod all-reduce, {result['ranks']} ranks on one host")
    ax.legend()


def _worker(spec: dict) -> None:
    """Runs on every rank: median time of `iters` all-reduces per size."""
    import statistics
    import time

    import tensorflow as tf

    from tfdist.horovod import runtime

    hvd = runtime.hvd()
    seconds = []
    for i, mb in enumerate(spec["sizes_mb"]):
        x = tf.ones([int(mb * 1e6 / 4)], tf.float32)
        name = f"bench_{i}"
        hvd.allreduce(x, op=hvd.Sum, name=name).numpy()  # warm-up (negotiation, buffers)
        times = []
        for _ in range(spec["iters"]):
            start = time.perf_counter()
            hvd.allreduce(x, op=hvd.Sum, name=name).numpy()
            times.append(time.perf_counter() - start)
        seconds.append(statistics.median(times))
    if hvd.rank() == 0:
        print(MARK + json.dumps({"seconds": seconds}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _worker(json.loads(sys.argv[2]))
