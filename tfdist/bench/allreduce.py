"""`python -m tfdist.bench allreduce`: all-reduce bandwidth per engine and tuning, side by side.

Paths measured, each on `--ranks` real processes of this host:

* shm: tfdist's shared-memory engine (`--strategy shm`), through the same
  TensorFlow op that allreduces gradients in training (`tfdist.shm.allreduce`
  inside a tf.function), with its default 4 MB and a 1 MB chunk per rank;
* MWMS: MultiWorkerMirroredStrategy all-reduce (`--collective ring`), started
  by `tfdist.launch`, with and without `bytes_per_pack` packing;
* Horovod Gloo and MPI (`horovodrun`, the Horovod venv, when installed), each
  as shipped and with the tuning knobs tfdist can pass: fusion threshold and
  cycle time (HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME) and OpenMPI
  transport settings (OMPI_MCA_* variables; `-mca btl` itself is set by
horovodrun, see VARIANTS).

Every point is the median of `--iters` timed float32 sum all-reduces after a
warm-up. algbw = bytes / time; busbw = algbw x 2(n-1)/n (nccl-tests). The
fastest path at 16-64 MB is compared with the issue's 1.2 GB/s goal.

`--hosts N --rate R`: one rank on each of N namespaced hosts whose links are
shaped to R (see `tfdist.bench.on_hosts`), MWMS and Horovod only (shm is one
host's shared memory); each point also gives busbw / link rate, the fraction
of the physical limit reached (a ring all-reduce's busbw cannot exceed it).

Many small tensors (`--small-tensors N`, default 200, as a real network's
gradients are): shm all-reduces N float32 tensors of 4-64 KB in one op, with
its tensor fusion and without, next to one tensor of the same total size;
the goal is fused busbw >= half the one tensor's.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time

from tfdist.bench import on_hosts, runs

DESCRIPTION = "all-reduce algbw/busbw, tfdist shm vs MWMS vs Horovod Gloo/MPI, with tuning knobs"
GOAL_BUSBW_GBS = 1.2
GOAL_RANGE_MB = (16.0, 64.0)
SMALL_TENSOR_BYTES = (4 << 10, 64 << 10)
GOAL_SMALL_FRACTION = 0.5  # fused small tensors vs one tensor of the same total
# (label, engine, controller, extra env, extra mpi args): each a tuning tried honestly.
VARIANTS = [
    ("tfdist shm", "shm", None, {"chunk_bytes": 4 << 20}, ""),
    ("tfdist shm, 1 MB chunks", "shm", None, {"chunk_bytes": 1 << 20}, ""),
    ("mwms ring", "mwms", None, {"bytes_per_pack": 0}, ""),
    ("mwms ring, 4 MB packs", "mwms", None, {"bytes_per_pack": 4 << 20}, ""),
    ("hvd gloo", "horovod", "gloo", {}, ""),
    ("hvd gloo, fusion 128MB, cycle 0.1ms", "horovod", "gloo",
     {"HOROVOD_FUSION_THRESHOLD": str(128 << 20), "HOROVOD_CYCLE_TIME": "0.1"}, ""),
    ("hvd mpi", "horovod", "mpi", {}, ""),
    # horovodrun already passes `-mca btl ^openib` (so vader, self and tcp remain and
    # vader carries local traffic); a second `-mca btl` is refused by mpirun, so the
    # shared-memory settings go in as OMPI_MCA_* variables instead.
    ("hvd mpi, vader cma single-copy", "horovod", "mpi",
     {"OMPI_MCA_btl_vader_single_copy_mechanism": "cma"}, ""),
    ("hvd mpi, allreduce ring, cycle 0.1ms", "horovod", "mpi",
     {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1", "OMPI_MCA_coll_tuned_allreduce_algorithm": "4",
      "HOROVOD_CYCLE_TIME": "0.1"}, ""),
    # --grad-compression fp16's casts around the same all-reduces: bytes on the wire
    # are measured (TCP bytes acknowledged from the kernel; the engine's own count for shm).
    ("mwms ring, fp16 compression", "mwms", None, {"bytes_per_pack": 0, "compression": "fp16"},
     ""),
    ("tfdist shm, fp16 compression", "shm", None, {"chunk_bytes": 4 << 20, "compression": "fp16"},
     ""),
]


def parse_sizes(text: str) -> list[float]:
    """Pure function: '4KB,1MB,64MB' -> sizes in MB (1 MB = 1e6 bytes).

    Raises:
        ValueError: for a size without a KB/MB/GB unit or not positive.
    """
    units = {"KB": 1e-3, "MB": 1.0, "GB": 1e3}
    out = []
    for token in [t.strip().upper() for t in text.split(",") if t.strip()]:
        unit = token[-2:]
        if unit not in units:
            raise ValueError(f"sizes need a KB, MB or GB unit. Received: {token!r}.")
        value = float(token[:-2]) * units[unit]
        if value <= 0:
            raise ValueError(f"sizes must be positive. Received: {token!r}.")
        out.append(value)
    return out


def small_tensor_bytes(count: int, seed: int = 0) -> list[int]:
    """Pure function: `count` float32 tensor sizes in bytes, uniform in 4-64 KB."""
    import numpy as np

    lo, hi = SMALL_TENSOR_BYTES
    return [int(b) * 4 for b in np.random.default_rng(seed).integers(lo // 4, hi // 4 + 1, count)]


def bus_bandwidth(algbw: float, ranks: int) -> float:
    """Pure function: nccl-tests' bus bandwidth of an all-reduce."""
    return algbw * 2 * (ranks - 1) / ranks if ranks > 1 else algbw


def comm_seconds(grad_bytes: float, workers: int, busbw_gbs: float) -> float:
    """Pure function: a ring all-reduce of `grad_bytes` on `workers`, 2(n-1)/n x bytes / busbw."""
    return (2 * (workers - 1) / workers * grad_bytes / (busbw_gbs * 1e9)) if workers > 1 else 0.0


def add_arguments(parser) -> None:
    """Flags of this benchmark."""
    parser.add_argument("-n", "--ranks", type=int, default=2)
    parser.add_argument("--sizes", default="4KB,256KB,1MB,4MB,16MB,32MB,64MB",
                        help="comma-separated sizes with units, e.g. 4KB,19MB,128MB")
    parser.add_argument("--iters", type=int, default=10, help="timed all-reduces per size")
    parser.add_argument("--variants", default="all",
                        help="'all', 'local' (shm and mwms, no Horovod), or comma-separated "
                             "indices into VARIANTS (0-based)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    parser.add_argument("--small-tensors", type=int, default=200,
                        help="shm: also all-reduce this many 4-64 KB tensors at once, fused "
                             "and not, against one tensor of their total size (0: skip)")
    parser.add_argument("--venv", default=None, help="Horovod venv")
    parser.add_argument("--timeout", type=float, default=400.0, help="per variant, seconds")
    parser.add_argument("--hosts", type=int, default=0,
                        help="N>=2: one rank per namespaced host (needs root; sets --ranks N)")
    parser.add_argument("--rate", default=None,
                        help="with --hosts: every link shaped to 1gbit, 10gbit or <n>mbit")


def _select(spec: str, have_horovod: bool, across_hosts: bool = False) -> list[tuple]:
    if spec == "all":
        chosen = VARIANTS
    elif spec == "local":
        chosen = [v for v in VARIANTS if v[1] != "horovod"]
    else:
        chosen = [VARIANTS[int(i)] for i in spec.split(",")]
    return [v for v in chosen if (v[1] != "horovod" or have_horovod)
            and not (across_hosts and v[1] == "shm")]


def _measure(variant, args, sizes_mb, hosts=None) -> tuple[list, list | None]:
    """Median seconds per size, and bytes sent per rank per all-reduce when measured."""
    label, engine, controller, knobs, mpi_args = variant
    spec = {"sizes_mb": sizes_mb, "iters": args.iters, "threads": args.threads, **knobs}
    if hosts is not None and engine == "mwms":
        result = on_hosts.run_workers(hosts, args.ranks, "tfdist.bench.allreduce",
                                      ["--worker", json.dumps({**spec, "engine": engine})],
                                      args.timeout, what=label)[0]
        return result["seconds"], result.get("wire_bytes")
    if hosts is not None:
        return on_hosts.run_horovod(hosts, args.venv_path, args.ranks, controller,
                                    "tfdist.bench.horovod_allreduce",
                                    ["--worker", json.dumps(spec)], args.timeout, env=knobs,
                                    mpi_args=mpi_args, what=label)[0]["seconds"], None
    if engine in ("mwms", "shm"):
        cmd = runs.launch_command(args.ranks, "tfdist.bench.allreduce",
                                  ["--worker", json.dumps({**spec, "engine": engine})],
                                  args.timeout)
        env = {}
    else:
        cmd = runs.horovod_command(args.venv_path, args.ranks, controller,
                                   "tfdist.bench.horovod_allreduce",
                                   ["--worker", json.dumps(spec)], mpi_args)
        env = knobs
    result = runs.run(cmd, args.timeout, env, what=label)[0]
    return result["seconds"], result.get("wire_bytes")


def run(args) -> dict:
    """Measures every selected variant; returns per-size bandwidths and the verdict."""
    sizes_mb = parse_sizes(args.sizes)
    link = on_hosts.check_args(getattr(args, "hosts", 0), getattr(args, "rate", None))
    if link:
        args.ranks = args.hosts
    args.venv_path = runs.horovod_venv(args.venv)
    variants = _select(args.variants, args.venv_path is not None, across_hosts=bool(link))
    with (on_hosts.shaped_hosts(args.hosts, args.rate) if link
          else contextlib.nullcontext()) as hosts:
        results = [_measure_variant(v, args, sizes_mb, hosts, link) for v in variants]
    small = _measure_small(args) if args.small_tensors > 0 and not link else None
    lo, hi = GOAL_RANGE_MB
    in_range = {r["label"]: [p["busbw_gbs"] for p in r["points"] if lo <= p["size_mb"] <= hi]
                for r in results}
    scored = {k: min(v) for k, v in in_range.items() if v}
    fastest = max(scored, key=scored.get) if scored else None
    where = (f"one rank on each of {args.ranks} namespaced hosts, links shaped to {args.rate}"
             if link else "all ranks on one host")
    return {"ranks": args.ranks, "iters": args.iters, "sizes_mb": sizes_mb,
            "hosts": args.ranks if link else 0, "rate": args.rate if link else None,
            "link_gbs": link, "horovod_venv": args.venv_path, "results": results,
            "fastest_16_64mb": fastest,
            "fastest_min_busbw_16_64mb_gbs": scored.get(fastest),
            "goal_busbw_gbs": GOAL_BUSBW_GBS,
            "goal_met": bool(fastest and scored[fastest] >= GOAL_BUSBW_GBS),
            "small_tensors": small,
            "note": f"median of iters per size; {where}; the fastest path is "
                    "the one whose slowest size in 16-64 MB is fastest"}


def _measure_variant(variant, args, sizes_mb, hosts, link) -> dict:
    """One variant's points; with a shaped link, busbw as a fraction of it too."""
    load = runs.load_average()
    seconds, wire = _measure(variant, args, sizes_mb, hosts)
    points = []
    for i, (mb, s) in enumerate(zip(sizes_mb, seconds)):
        algbw = mb * 1e6 / s / 1e9
        point = {"size_mb": mb, "seconds": s, "algbw_gbs": algbw,
                 "busbw_gbs": bus_bandwidth(algbw, args.ranks),
                 "wire_mb_per_rank": None if wire is None else wire[i] / 1e6}
        if link:
            point["busbw_over_link"] = point["busbw_gbs"] / link
        points.append(point)
    return {"label": variant[0], "engine": variant[1], "controller": variant[2],
            "knobs": variant[3], "mpi_args": variant[4], "load_avg_1m": load,
            "load_avg_1m_end": runs.load_average(), "points": points}


def _measure_small(args) -> dict:
    """shm: N small tensors fused, unfused, and one tensor of their total size."""
    sizes = small_tensor_bytes(args.small_tensors)
    spec = {"engine": "shm", "small_bytes": sizes, "iters": args.iters, "threads": args.threads}
    load = runs.load_average()
    cmd = runs.launch_command(args.ranks, "tfdist.bench.allreduce",
                              ["--worker", json.dumps(spec)], args.timeout)
    measured = runs.run(cmd, args.timeout, {}, what="shm small tensors")[0]
    seconds = measured["seconds"]
    total = sum(sizes)
    busbw = {k: bus_bandwidth(total / s / 1e9, args.ranks) for k, s in seconds.items()}
    return {"count": len(sizes), "total_mb": total / 1e6, "tensor_kb": [b / 1e3 for b in sizes],
            "fusion_threshold_bytes": measured["fusion_threshold_bytes"],
            "seconds": seconds, "busbw_gbs": busbw, "load_avg_1m": load,
            "fused_over_one": busbw["fused"] / busbw["one_tensor"],
            "unfused_over_one": busbw["unfused"] / busbw["one_tensor"],
            "goal_fraction": GOAL_SMALL_FRACTION,
            "goal_met": busbw["fused"] >= GOAL_SMALL_FRACTION * busbw["one_tensor"]}


def table(result: dict) -> str:
    """busbw per size (rows) and variant (columns), then the verdict."""
    from tfdist.bench.report import format_table

    labels = [r["label"] for r in result["results"]]
    rows = []
    link = result.get("link_gbs")
    for i, mb in enumerate(result["sizes_mb"]):
        rows.append([f"{mb:g}"] + [r["points"][i]["busbw_gbs"] for r in result["results"]])
        if link:
            rows.append([f"{mb:g} /link"] + [r["points"][i]["busbw_over_link"]
                                              for r in result["results"]])
    rows.append(["load 1m"] + [r["load_avg_1m"] for r in result["results"]])
    out = format_table(["MB \\ busbw GB/s"] + labels, rows)
    if link:
        out = (f"{result['ranks']} hosts, links shaped to {result['rate']} "
               f"({link:.3f} GB/s); '/link' rows: busbw / link rate\n{out}")
    best = result["fastest_16_64mb"]
    if link:
        top = max(((p["busbw_over_link"], r["label"], p["size_mb"]) for r in result["results"]
                   for p in r["points"]), default=None)
        return out + (f"\nbest: {top[1]} at {top[2]:g} MB, {top[0]:.0%} of the link rate"
                      if top else "")
    verdict = (f"fastest at 16-64 MB: {best}, min busbw {result['fastest_min_busbw_16_64mb_gbs']:.3f}"
               f" GB/s; goal >= {result['goal_busbw_gbs']} GB/s: "
               f"{'met' if result['goal_met'] else 'NOT met'}") if best else "no size in 16-64 MB"
    for r in result["results"]:
        wire = r["points"][-1].get("wire_mb_per_rank")
        if wire is not None:
            verdict += (f"\n{r['label']}: {wire:.2f} MB written per rank per all-reduce of "
                        f"{r['points'][-1]['size_mb']:g} MB float32")
    small = result.get("small_tensors")
    if small:
        bw = small["busbw_gbs"]
        verdict += (f"\nshm, {small['count']} tensors of 4-64 KB ({small['total_mb']:.1f} MB): "
                    f"fused {bw['fused']:.3f} GB/s, unfused {bw['unfused']:.3f} GB/s, one "
                    f"tensor {bw['one_tensor']:.3f} GB/s busbw; fused/one = "
                    f"{small['fused_over_one']:.2f} (goal >= {small['goal_fraction']}: "
                    f"{'met' if small['goal_met'] else 'NOT met'}; load {small['load_avg_1m']:.1f})")
    return f"{out}\n{verdict}"


def plot(result: dict, fig) -> None:
    """busbw against message size, one line per variant."""
    ax = fig.add_subplot(111)
    for r in result["results"]:
        ax.plot([p["size_mb"] for p in r["points"]], [p["busbw_gbs"] for p in r["points"]],
                "o-", label=r["label"])
    if result.get("link_gbs"):
        ax.axhline(result["link_gbs"], color="black", linestyle=":",
                   label=f"link rate ({result['rate']})")
        where = f"one per host, links at {result['rate']}"
    else:
        ax.axhline(result["goal_busbw_gbs"], color="red", linestyle="--", label="goal")
        where = "on one host"
    small = result.get("small_tensors")
    if small:
        for key, marker in (("fused", "s"), ("unfused", "x"), ("one_tensor", "^")):
            ax.plot([small["total_mb"]], [small["busbw_gbs"][key]], marker, markersize=9,
                    label=f"shm {small['count']} tensors 4-64 KB: {key.replace('_', ' ')}")
    ax.set_xscale("log")
    ax.set_xlabel("message size (MB)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"all-reduce, {result['ranks']} ranks {where}")
    ax.legend(fontsize=7)


def _time_sizes(spec: dict, step, make_input, before=None, sent=None):
    """Median seconds of `step(make_input(elements))` per size, after one warm-up call.

    Returns (seconds per size, bytes `sent()` grew by per call per size).
    """
    seconds, wire = [], []
    for mb in spec["sizes_mb"]:
        x = make_input(max(1, int(mb * 1e6 / 4)))
        step(x).numpy()  # warm-up: trace, instance keys, buffers
        times, start_bytes = [], sent()
        for _ in range(spec["iters"]):
            if before is not None:
                before()
            start = time.perf_counter()
            step(x).numpy()
            times.append(time.perf_counter() - start)
        wire.append((sent() - start_bytes) / spec["iters"])
        seconds.append(statistics.median(times))
    return seconds, wire


def _tcp_bytes_acked() -> int:
    """Bytes this process's open TCP sockets sent and had acknowledged (Linux TCP_INFO).

    gRPC sends with sendmsg, which /proc/self/io does not count; the kernel's
    per-connection tcpi_bytes_acked (struct tcp_info offset 120) does.
    """
    import os
    import socket
    import struct

    total = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            with socket.fromfd(int(fd), socket.AF_INET, socket.SOCK_STREAM) as sock:
                info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 128)
        except OSError:
            continue  # gone meanwhile, or not a TCP socket
        if len(info) >= 128:
            total += struct.unpack_from("<Q", info, 120)[0]
    return total


def _compressed(fn, name: str):
    """`fn` (a tensor to its all-reduced value) with --grad-compression's casts around it."""
    from tfdist import compression

    def run(t):
        (wire,), restore = compression.compress([t], name)
        return compression.decompress([fn(wire)], restore)[0]

    return run


def _mwms_worker(spec: dict) -> None:
    """Runs on every MWMS worker: median seconds per all-reduce per size."""
    import tensorflow as tf

    from tfdist.cluster import detect
    from tfdist.strategies import StrategyOptions, build_strategy
    from tfdist.strategies.devices import configure_runtime

    configure_runtime(intra_op_threads=spec["threads"])
    cluster = detect()
    strategy = build_strategy("multi_worker", cluster, StrategyOptions(collective="ring"))
    options = tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=spec["bytes_per_pack"],
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)

    @tf.function
    def step(x):
        def fn(t):
            # identity: a tf.function argument has no device, and the all-reduce
            # needs one (ValueError: destinations can not be empty); no copy on CPU.
            t = tf.identity(t)
            reduce = _compressed(lambda w: tf.distribute.get_replica_context().all_reduce(
                "SUM", w, options=options), spec.get("compression", "none"))
            # Only a slice comes back to Python: the timing is the collective's, not a copy's.
            return reduce(t)[:1]
        return strategy.run(fn, args=(x,))

    def make_input(n):
        # A distributed value lives on the replica's device, as gradients do.
        return strategy.experimental_distribute_values_from_function(
            lambda _ctx: tf.ones([n], tf.float32))

    seconds, wire = _time_sizes(spec, step, make_input, sent=_tcp_bytes_acked)
    if cluster.is_chief:
        runs.emit({"seconds": seconds, "wire_bytes": wire})


def _shm_worker(spec: dict) -> None:
    """Runs on every shm rank: median seconds per all-reduce per size, through the TF op."""
    import tensorflow as tf

    from tfdist import shm
    from tfdist.cluster import detect
    from tfdist.strategies.devices import configure_runtime

    configure_runtime(intra_op_threads=spec["threads"])
    cluster = detect()
    comm = shm.init_from_cluster(cluster, chunk_bytes=spec["chunk_bytes"])

    @tf.function
    def step(x):
        # Only a slice comes back to Python, as in the MWMS worker.
        reduce = _compressed(lambda w: shm.allreduce([w], average=False)[0],
                             spec.get("compression", "none"))
        return reduce(x)[:1]

    # Start each all-reduce together: time the collective, not the other rank's lag.
    seconds, wire = _time_sizes(spec, step, lambda n: tf.ones([n], tf.float32),
                                before=comm.barrier, sent=lambda: comm.bytes_sent)
    if cluster.is_chief:
        runs.emit({"seconds": seconds, "wire_bytes": wire})


def _shm_small_worker(spec: dict) -> None:
    """Runs on every shm rank: median seconds for N small tensors fused, unfused, and one."""
    import tensorflow as tf

    from tfdist import shm
    from tfdist.cluster import detect
    from tfdist.strategies.devices import configure_runtime

    configure_runtime(intra_op_threads=spec["threads"])
    cluster = detect()
    comm = shm.init_from_cluster(cluster)
    threshold = comm.fusion_threshold_bytes

    def time_it(variables, fusion):
        comm.fusion_threshold_bytes = fusion  # the same on every rank; read when traced

        @tf.function
        def step():
            # Read in the graph, as gradients are made there: 200 tf.function arguments
            # would cost more Python than the all-reduce. One op reduces them all.
            ys = shm.allreduce([v.read_value() for v in variables], average=False)
            return tf.stack([ys[0][0], ys[-1][0]])

        step().numpy()  # warm-up
        times = []
        for _ in range(spec["iters"]):
            comm.barrier()
            start = time.perf_counter()
            step().numpy()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    small = [tf.Variable(tf.ones([b // 4], tf.float32)) for b in spec["small_bytes"]]
    one = [tf.Variable(tf.ones([sum(spec["small_bytes"]) // 4], tf.float32))]
    seconds = {"one_tensor": time_it(one, threshold), "fused": time_it(small, threshold),
               "unfused": time_it(small, 0)}
    if cluster.is_chief:
        runs.emit({"seconds": seconds, "fusion_threshold_bytes": threshold})


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker_spec = json.loads(sys.argv[2])
        if "small_bytes" in worker_spec:
            _shm_small_worker(worker_spec)
        else:
            (_shm_worker if worker_spec.get("engine") == "shm" else _mwms_worker)(worker_spec)
