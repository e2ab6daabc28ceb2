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


def bus_bandwidth(algbw: float, ranks: int) -> float:
    """Pure function: nccl-tests' bus bandwidth of an all-reduce."""
    return algbw * 2 * (ranks - 1) / ranks if ranks > 1 else algbw


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


def _measure(variant, args, sizes_mb, hosts=None) -> list[float]:
    label, engine, controller, knobs, mpi_args = variant
    spec = {"sizes_mb": sizes_mb, "iters": args.iters, "threads": args.threads, **knobs}
    if hosts is not None and engine == "mwms":
        return on_hosts.run_workers(hosts, args.ranks, "tfdist.bench.allreduce",
                                    ["--worker", json.dumps({**spec, "engine": engine})],
                                    args.timeout, what=label)[0]["seconds"]
    if hosts is not None:
        return on_hosts.run_horovod(hosts, args.venv_path, args.ranks, controller,
                                    "tfdist.bench.horovod_allreduce",
                                    ["--worker", json.dumps(spec)], args.timeout, env=knobs,
                                    mpi_args=mpi_args, what=label)[0]["seconds"]
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
    return runs.run(cmd, args.timeout, env, what=label)[0]["seconds"]


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
            "note": f"median of iters per size; {where}; the fastest path is "
                    "the one whose slowest size in 16-64 MB is fastest"}


def _measure_variant(variant, args, sizes_mb, hosts, link) -> dict:
    """One variant's points; with a shaped link, busbw as a fraction of it too."""
    load = runs.load_average()
    seconds = _measure(variant, args, sizes_mb, hosts)
    points = []
    for mb, s in zip(sizes_mb, seconds):
        algbw = mb * 1e6 / s / 1e9
        point = {"size_mb": mb, "seconds": s, "algbw_gbs": algbw,
                 "busbw_gbs": bus_bandwidth(algbw, args.ranks)}
        if link:
            point["busbw_over_link"] = point["busbw_gbs"] / link
        points.append(point)
    return {"label": variant[0], "engine": variant[1], "controller": variant[2],
            "knobs": variant[3], "mpi_args": variant[4], "load_avg_1m": load,
            "load_avg_1m_end": runs.load_average(), "points": points}


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
    ax.set_xscale("log")
    ax.set_xlabel("message size (MB)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"all-reduce, {result['ranks']} ranks {where}")
    ax.legend(fontsize=7)


def _time_sizes(spec: dict, step, make_input, before=None) -> list[float]:
    """Median seconds of `step(make_input(elements))` per size, after one warm-up call."""
    seconds = []
    for mb in spec["sizes_mb"]:
        x = make_input(max(1, int(mb * 1e6 / 4)))
        step(x).numpy()  # warm-up: trace, instance keys, buffers
        times = []
        for _ in range(spec["iters"]):
            if before is not None:
                before()
            start = time.perf_counter()
            step(x).numpy()
            times.append(time.perf_counter() - start)
        seconds.append(statistics.median(times))
    return seconds


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
            # Only a slice comes back to Python: the timing is the collective's, not a copy's.
            return tf.distribute.get_replica_context().all_reduce("SUM", t, options=options)[:1]
        return strategy.run(fn, args=(x,))

    def make_input(n):
        # A distributed value lives on the replica's device, as gradients do.
        return strategy.experimental_distribute_values_from_function(
            lambda _ctx: tf.ones([n], tf.float32))

    seconds = _time_sizes(spec, step, make_input)
    if cluster.is_chief:
        runs.emit({"seconds": seconds})


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
        return shm.allreduce([x], average=False)[0][:1]

    # Start each all-reduce together: time the collective, not the other rank's lag.
    seconds = _time_sizes(spec, step, lambda n: tf.ones([n], tf.float32), before=comm.barrier)
    if cluster.is_chief:
        runs.emit({"seconds": seconds})


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker_spec = json.loads(sys.argv[2])
        (_shm_worker if worker_spec.get("engine") == "shm" else _mwms_worker)(worker_spec)
