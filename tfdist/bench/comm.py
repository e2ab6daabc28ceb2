"""`python -m tfdist.bench comm`: communication/computation estimate for a model and cluster, checked.

The estimate (one synchronous data-parallel step, no overlap):

    compute = FLOPs per example x examples per worker / compute rate
    comm    = 2(n-1)/n x gradient bytes / bus bandwidth       (ring all-reduce)
    step    = compute + comm

FLOPs are counted from the recipe's Keras model (Dense: 2*in*out, Conv2D:
2*H*W*k*k*Cin*Cout per example; training = 3 x forward; other layers are
ignored and listed). The compute rate is a measured one-thread float32 matmul
on this host, the bus bandwidth a measured MWMS ring all-reduce of exactly
the gradient size (or `--bandwidth-gbs`). The check: the same recipe trained
for real, 1 worker (`single`) and n workers (`multi_worker`), with the
trainer's steady-state step time.
"""

from __future__ import annotations

import json
import time

from tfdist.bench import allreduce, runs, scaling
from tfdist.bench.model_stats import model_stats
from tfdist.bench.allreduce import comm_seconds

DESCRIPTION = "comm/compute ratio: predicted step = compute + 2(n-1)/n*bytes/bw, vs measured"


def add_arguments(parser) -> None:
    """Flags of this benchmark."""
    parser.add_argument("--recipe", default="wide_mlp")
    parser.add_argument("-n", "--workers", type=int, default=2)
    parser.add_argument("--per-worker-batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bandwidth-gbs", type=float, default=0.0,
                        help="bus bandwidth to assume (0: measure MWMS at the gradient size)")
    parser.add_argument("--gflops", type=float, default=0.0,
                        help="compute rate to assume (0: measure a 1-thread matmul)")
    parser.add_argument("--timeout", type=float, default=400.0)


def predict(flops_per_example: float, batch_per_worker: int, grad_bytes: float,
            workers: int, gflops: float, busbw_gbs: float) -> dict:
    """Pure function: the estimate's terms in seconds, and comm/compute."""
    compute = flops_per_example * batch_per_worker / (gflops * 1e9)
    comm = comm_seconds(grad_bytes, workers, busbw_gbs)
    return {"compute_s": compute, "comm_s": comm, "step_s": compute + comm,
            "comm_over_compute": comm / compute if compute else float("inf")}


def matmul_gflops(threads: int, n: int = 1024, reps: int = 10) -> float:
    """Measured float32 matmul rate on `threads` intra-op threads (call before other TF work)."""
    from tfdist.compat.tf_startup_logs import import_tensorflow

    tf = import_tensorflow()

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    a = tf.random.normal([n, n])
    tf.linalg.matmul(a, a).numpy()
    start = time.perf_counter()
    for _ in range(reps):
        c = tf.linalg.matmul(a, a)
    c.numpy()
    return 2 * n ** 3 * reps / (time.perf_counter() - start) / 1e9


def run(args) -> dict:
    """Estimates, then measures 1 and n workers; returns both and their ratio."""
    # The matmul first: the thread count can only be set before TensorFlow's first op.
    gflops = args.gflops or matmul_gflops(args.threads)
    stats = model_stats(args.recipe)
    loads = {"start": runs.load_average()}
    bw_source = "given"
    busbw = args.bandwidth_gbs
    if not busbw:
        mb = stats["grad_bytes"] / 1e6
        spec = {"sizes_mb": [mb], "iters": 5, "threads": args.threads, "bytes_per_pack": 0}
        cmd = runs.launch_command(args.workers, "tfdist.bench.allreduce",
                                  ["--worker", json.dumps(spec)], args.timeout)
        seconds = runs.run(cmd, args.timeout + 60, what="comm bandwidth")[0]["seconds"][0]
        busbw = allreduce.bus_bandwidth(mb * 1e6 / seconds / 1e9, args.workers)
        bw_source = f"measured: MWMS ring all-reduce of {mb:.1f} MB"
    bench_args = type("A", (), dict(out=args.out, steps=args.steps, warmup=args.warmup,
                                    threads=args.threads, inter_op_threads=1,
                                    timeout=args.timeout, venv=None,
                                    controller="gloo"))
    b = args.per_worker_batch
    one = scaling.one_run(bench_args, args.recipe, "multi_worker", 1, b, "comm_1")
    many = scaling.one_run(bench_args, args.recipe, "multi_worker", args.workers,
                           b * args.workers, f"comm_{args.workers}")
    loads["end"] = runs.load_average()
    pred = predict(stats["train_flops_per_example"], b, stats["grad_bytes"], args.workers,
                   gflops, busbw)
    # The same estimate with the compute term taken from the measured 1-worker step.
    pred_measured_compute = one["step_s"] + pred["comm_s"]
    return {"recipe": args.recipe, "workers": args.workers, "per_worker_batch": b,
            "model": stats, "gflops": gflops, "busbw_gbs": busbw, "bandwidth_source": bw_source,
            "predicted": pred, "predicted_step_s_with_measured_compute": pred_measured_compute,
            "measured": {"step_1_worker_s": one["step_s"],
                         f"step_{args.workers}_workers_s": many["step_s"],
                         "comm_s_implied": many["step_s"] - one["step_s"]},
            "measured_step_s": many["step_s"],
            "predicted_over_measured": pred["step_s"] / many["step_s"],
            "load_avg_1m": loads,
            "note": "no overlap of communication and computation assumed; all workers on one "
                    "host, one intra-op thread each"}


def table(result: dict) -> str:
    """Predicted vs measured terms."""
    from tfdist.bench.report import format_table

    p, m, n = result["predicted"], result["measured"], result["workers"]
    rows = [["compute (1 worker step)", p["compute_s"] * 1e3, m["step_1_worker_s"] * 1e3],
            [f"communication ({n} workers)", p["comm_s"] * 1e3, m["comm_s_implied"] * 1e3],
            [f"step ({n} workers)", p["step_s"] * 1e3, m[f"step_{n}_workers_s"] * 1e3],
            [f"step ({n} workers), measured compute",
             result["predicted_step_s_with_measured_compute"] * 1e3, m[f"step_{n}_workers_s"] * 1e3]]
    st = result["model"]
    head = (f"{result['recipe']}: {st['params']:,} params ({st['grad_bytes'] / 1e6:.1f} MB "
            f"gradients), {st['train_flops_per_example'] / 1e6:.1f} MFLOP/example (train); "
            f"{result['gflops']:.1f} GFLOP/s per worker; busbw {result['busbw_gbs']:.3f} GB/s "
            f"({result['bandwidth_source']}); comm/compute predicted "
            f"{p['comm_over_compute']:.2f}; load 1m {result['load_avg_1m']['start']:.2f}-"
            f"{result['load_avg_1m']['end']:.2f}")
    return head + "\n" + format_table(["term", "predicted ms", "measured ms"], rows)


def plot(result: dict, fig) -> None:
    """Stacked predicted compute + comm beside the measured step."""
    ax = fig.add_subplot(111)
    p, n = result["predicted"], result["workers"]
    measured = result["measured"]
    ax.bar(0, p["compute_s"] * 1e3, label="predicted compute")
    ax.bar(0, p["comm_s"] * 1e3, bottom=p["compute_s"] * 1e3, label="predicted comm")
    ax.bar(1, measured["step_1_worker_s"] * 1e3, label="measured 1-worker step")
    ax.bar(1, max(0.0, measured["comm_s_implied"]) * 1e3,
           bottom=measured["step_1_worker_s"] * 1e3, label="measured extra at n workers")
    ax.set_xticks([0, 1], ["predicted", "measured"])
    ax.set_ylabel(f"ms per step, {n} workers")
    ax.set_title(f"{result['recipe']}: comm/compute = {p['comm_over_compute']:.2f} (predicted)")
    ax.legend(fontsize=7)
