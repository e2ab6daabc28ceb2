"""`python -m tfdist.bench collectives`: the five collectives on N real workers, checked by numpy.

`tfdist.launch -n N` starts N workers; each builds MultiWorkerMirroredStrategy
(which joins the workers and configures TensorFlow's collective executor) and
then runs TensorFlow's collective ops directly on its own device:
all-reduce (CollectiveReduceV2) and all-gather (CollectiveGatherV2). The
other three are composed from all-reduce on CPU, each for a measured reason:
broadcast sums the root's tensor with zeros (TF 2.21's CollectiveBcastSend/
Recv hung on CPU, see `bcast`); `reduce` is an all-reduce only the root keeps
(TensorFlow has no rooted reduce op); `reduce_scatter` is an all-reduce of
which each worker keeps its own 1/N slice (CollectiveReduceScatterV2 has only
an NCCL kernel).

Worker r starts from x_r = [r*10 + j for j in range(2N)] (float32), so every
result can be recomputed with numpy from the inputs alone. The table shows
each worker's tensor before and after each op, the classic picture.
"""

from __future__ import annotations

import sys

from tfdist.bench import runs

DESCRIPTION = "all-reduce, broadcast, reduce, all-gather, reduce-scatter on N workers vs numpy"
OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter")
ROOT = 0


def add_arguments(parser) -> None:
    """Flags of this benchmark."""
    parser.add_argument("-n", "--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=180.0)


def inputs(rank: int, workers: int) -> list[float]:
    """Pure function: worker `rank`'s input tensor (length 2 x workers)."""
    return [float(rank * 10 + j) for j in range(2 * workers)]


def expected(op: str, rank: int, workers: int):
    """Pure function: what worker `rank` must hold after `op` (numpy), None where it holds nothing."""
    import numpy as np

    xs = np.array([inputs(r, workers) for r in range(workers)], dtype=np.float32)
    total = xs.sum(axis=0)
    if op == "all_reduce":
        return total
    if op == "broadcast":
        return xs[ROOT]
    if op == "reduce":
        return total if rank == ROOT else None
    if op == "all_gather":
        return xs.reshape(-1)
    if op == "reduce_scatter":
        return np.split(total, workers)[rank]
    raise ValueError(f"op must be one of {OPS}. Received: {op!r}.")


def check(results: list[dict], workers: int) -> dict:
    """Pure function: per op, whether every worker's output equals numpy's."""
    import numpy as np

    verdict = {}
    for op in OPS:
        ok = True
        for res in results:
            want, got = expected(op, res["rank"], workers), res["after"][op]
            ok &= (got is None) if want is None else (
                got is not None and np.allclose(np.array(got, np.float32), want))
        verdict[op] = ok
    return verdict


def run(args) -> dict:
    """Runs the workers, then checks every worker's outputs against numpy."""
    cmd = runs.launch_command(args.workers, "tfdist.bench.collectives", ["--worker"], args.timeout)
    results = sorted(runs.run(cmd, args.timeout + 60, what="collectives"),
                     key=lambda r: r["rank"])
    if [r["rank"] for r in results] != list(range(args.workers)):
        raise RuntimeError(f"expected one result per worker. Received ranks "
                           f"{[r['rank'] for r in results]}.")
    verdict = check(results, args.workers)
    return {"workers": args.workers, "root": ROOT, "workers_results": results,
            "passed": verdict, "all_passed": all(verdict.values()),
            "note": "broadcast = all-reduce of root tensor + zeros (TF bcast ops hung on CPU); "
                    "reduce = all-reduce kept on the root (no rooted reduce op in TF); reduce_scatter "
                    "= all-reduce + own slice (CollectiveReduceScatterV2 is NCCL-only)"}


def _fmt(values) -> str:
    return "-" if values is None else "[" + " ".join(f"{v:g}" for v in values) + "]"


def table(result: dict) -> str:
    """Before/after per worker per op, and the numpy verdict."""
    from tfdist.bench.report import format_table

    rows = []
    for op in OPS:
        for res in result["workers_results"]:
            rows.append([op, res["rank"], _fmt(res["before"]), _fmt(res["after"][op]),
                         "pass" if result["passed"][op] else "FAIL"])
    return format_table(["op", "worker", "before", "after", "vs numpy"], rows)


def plot(result: dict, fig) -> None:
    """One panel per op: each worker's tensor before (left) and after (right)."""
    axes = fig.subplots(1, len(OPS))
    n = result["workers"]
    for ax, op in zip(axes, OPS):
        for res in result["workers_results"]:
            after = res["after"][op]
            ax.text(0.02, 1 - (res["rank"] + 1) / (n + 1), _fmt(res["before"]), fontsize=6)
            ax.text(0.52, 1 - (res["rank"] + 1) / (n + 1), _fmt(after), fontsize=6)
        ax.set_title(f"{op}\n{'pass' if result['passed'][op] else 'FAIL'}", fontsize=8)
        ax.set_xticks([0.25, 0.75], ["before", "after"], fontsize=6)
        ax.set_yticks([])


def _placed(device, fn, x):
    import tensorflow as tf

    with tf.device(device):
        return tf.identity(fn(x))


def _worker() -> None:
    """Runs on every worker: the five collectives on this worker's device."""
    import tensorflow as tf
    from tensorflow.python.ops import collective_ops

    from tfdist.cluster import detect
    from tfdist.strategies import StrategyOptions, build_strategy
    from tfdist.strategies.devices import configure_runtime

    configure_runtime(intra_op_threads=1)
    cluster = detect()
    strategy = build_strategy("multi_worker", cluster,
                              StrategyOptions(collective="ring", collective_timeout_s=60))
    n, rank = cluster.num_workers, cluster.worker_index
    device = strategy.extended.worker_devices[0]
    before = inputs(rank, n)
    # Group keys far above MWMS's own (which count up from 1); one instance per op.
    group = dict(group_size=n, group_key=1000)

    def on_device(fn):
        # One tf.function per op, called in the same order on every worker, so no
        # two collectives can be scheduled in different orders on different workers.
        return tf.function(lambda x: _placed(device, fn, x))

    def bcast(x):
        # TensorFlow's broadcast ops (CollectiveBcastSend/Recv, V1 and V2) hung here
        # on TF 2.21 CPU: the receiver's instance look-up at the leader fails with
        # gRPC "Socket closed" while the sender waits forever. So broadcast is an
        # all-reduce of the root's tensor and zeros elsewhere (same result, 2x bytes).
        mine = x if rank == ROOT else tf.zeros_like(x)
        return collective_ops.all_reduce_v2(mine, instance_key=1002, **group)

    ops = {
        "all_reduce": lambda x: collective_ops.all_reduce_v2(x, instance_key=1001, **group),
        "broadcast": bcast,
        "reduce": lambda x: collective_ops.all_reduce_v2(x, instance_key=1003, **group),
        "all_gather": lambda x: collective_ops.all_gather_v2(x, instance_key=1004, **group),
        # CollectiveReduceScatterV2 has only an NCCL (GPU) kernel: on CPU it fails
        # with "CollectiveRegistry::Lookup did not find collective implementation".
        "reduce_scatter": lambda x: tf.split(
            collective_ops.all_reduce_v2(x, instance_key=1005, **group), n)[rank],
    }
    x = tf.constant(before)
    after = {op: on_device(ops[op])(x).numpy().tolist() for op in OPS}

    @tf.function
    def barrier():
        with tf.device(device):
            return collective_ops.all_reduce_v2(tf.constant(0.0), instance_key=1006, **group)

    # The leader (worker 0) must outlive the others' instance look-ups: without this
    # barrier a fast worker 0 exits while worker 1's broadcast receive still asks it
    # (gRPC "Socket closed").
    barrier().numpy()
    if rank != ROOT:
        after["reduce"] = None  # a reduce leaves nothing on non-root workers
    for op in OPS:
        print(f"worker {rank} {op:>14}: before {_fmt(before)} after {_fmt(after[op])}", flush=True)
    runs.emit({"rank": rank, "before": before, "after": after})


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        _worker()
