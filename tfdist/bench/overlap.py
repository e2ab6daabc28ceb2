"""`python -m tfdist.bench overlap`: is the gradient all-reduce hidden behind the backward pass? (#31)

For each recipe, side by side in one run and interleaved `--repeats` times:

* compute only: one worker training alone (`single`) on the per-worker batch
  (on host h0 with `--hosts`);
* all-reduce only: each engine all-reducing the bytes its gradients put on
  the wire (float32 gradients, or half of them under fp16 compression), one
  float32 tensor of that size, timed by `bench allreduce`'s workers;
* the measured step of N workers training together, per engine, gradient
  compression and `--bucket-mb` (multi_worker and shm; Horovod overlaps on
  its own: its background thread reduces each gradient as it appears).

The floor is max(compute, all-reduce): a step that overlaps perfectly takes
the longer of the two, one that does not overlaps takes their sum. Each
configuration's step is reported against its floor, and every bucketed
configuration against the same engine and compression with `--bucket-mb 0`
(one all-reduce after the backward pass, as before #31), as throughput
ratios paired by repeat (>1: buckets faster).

`--hosts N --rate R`: worker i on namespaced host hi, links shaped to R
(`tfdist.bench.on_hosts`); shm is one host's shared memory and is left out
there (said in the result).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics

from tfdist.bench import allreduce, on_hosts, runs, scaling
from tfdist.compression import NAMES, wire_bytes

DESCRIPTION = ("all-reduce overlapped with the backward pass: step vs max(compute, "
               "all-reduce) per engine, bucket size and compression")
ENGINES = ("multi_worker", "shm", "horovod")
BUCKETED = ("multi_worker", "shm")  # the engines --bucket-mb applies to
# The engine name `bench allreduce`'s workers take.
ALLREDUCE_ENGINE = {"multi_worker": "mwms", "shm": "shm", "horovod": "horovod"}


def add_arguments(parser) -> None:
    """Flags of this benchmark."""
    parser.add_argument("-n", "--workers", type=int, default=2)
    parser.add_argument("--recipes", default="wide_mlp", help="comma-separated recipes")
    parser.add_argument("--engines", default="multi_worker,shm",
                        help=f"comma-separated, from {list(ENGINES)} (horovod needs the venv)")
    parser.add_argument("--buckets", default="0,4",
                        help="comma-separated --bucket-mb values for multi_worker and shm "
                             "(0: one all-reduce after the backward pass)")
    parser.add_argument("--grad-compression", default="none",
                        help="comma-separated: none, fp16 and/or bf16")
    parser.add_argument("--per-worker-batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per worker")
    parser.add_argument("--inter-op-threads", type=int, default=0,
                        help="inter-op threads per worker (0: TensorFlow's choice)")
    parser.add_argument("--cpu-bind", choices=("none", "cores"), default="none",
                        help="one host: each worker on its own share of the cores")
    parser.add_argument("--allreduce-iters", type=int, default=10)
    parser.add_argument("--controller", choices=("gloo", "mpi"), default="gloo")
    parser.add_argument("--venv", default=None, help="Horovod venv (default: the cached one)")
    parser.add_argument("--timeout", type=float, default=400.0)
    parser.add_argument("--hosts", type=int, default=0,
                        help="N>=2: worker i on namespaced host hi (needs root; sets -n N)")
    parser.add_argument("--rate", default=None, help="with --hosts: 1gbit, 10gbit or <n>mbit")


def configurations(engines: list[str], compressions: list[str],
                   buckets: list[float]) -> list[tuple[str, str, float | None]]:
    """Pure function: (engine, compression, bucket MB or None) in run order.

    Horovod gets one configuration per compression (bucket None: its own overlap).
    """
    out = []
    for engine in engines:
        for comp in compressions:
            out += ([(engine, comp, b) for b in buckets] if engine in BUCKETED
                    else [(engine, comp, None)])
    return out


def config_name(engine: str, compression: str, bucket: float | None) -> str:
    """Pure function: 'multi_worker+fp16 @4MB', 'horovod'."""
    name = engine + (f"+{compression}" if compression != "none" else "")
    return name if bucket is None else f"{name} @{bucket:g}MB"


def summarize(compute_s: list[float], allreduce_s: list[float], step_s: list[float],
              base_step_s: list[float] | None) -> dict:
    """Pure function: one configuration's row from its per-repeat times (seconds).

    Args:
        compute_s: One worker alone, per repeat.
        allreduce_s: The engine's all-reduce of the wire bytes, per repeat.
        step_s: The configuration's N-worker step, per repeat.
        base_step_s: The same engine and compression without buckets, per
            repeat (None for itself or Horovod).

    Returns:
        Medians, the floor max(compute, all-reduce), step / floor, the sum
        compute + all-reduce (no overlap) and, with a base, the throughput
        ratio base step / step per repeat and its median.
    """
    compute, comm, step = (statistics.median(v) for v in (compute_s, allreduce_s, step_s))
    floor = max(compute, comm)
    row = {"compute_s": compute, "allreduce_s": comm, "floor_s": floor,
           "serial_s": compute + comm, "step_s": step, "step_over_floor": step / floor,
           "tries_step_s": list(step_s)}
    if base_step_s:
        ratios = [b / s for b, s in zip(base_step_s, step_s)]
        row.update(vs_no_buckets=statistics.median(ratios), vs_no_buckets_per_repeat=ratios)
    return row


def run(args) -> dict:
    """Measures every configuration; returns rows per recipe."""
    link = on_hosts.check_args(args.hosts, args.rate)
    engines = [e for e in args.engines.split(",") if e]
    compressions = [c for c in args.grad_compression.split(",") if c]
    try:
        buckets = [float(b) for b in args.buckets.split(",") if b]
    except ValueError:
        raise SystemExit(f"error: --buckets takes comma-separated numbers of MB. Received: "
                         f"{args.buckets!r}.") from None
    bad = [e for e in engines if e not in ENGINES]
    if bad or not engines:
        raise SystemExit(f"error: --engines takes a comma-separated list from {list(ENGINES)}. "
                         f"Received: {args.engines!r}.")
    if not compressions or any(c not in NAMES for c in compressions):
        raise SystemExit(f"error: --grad-compression takes a comma-separated list from "
                         f"{list(NAMES)}. Received: {args.grad_compression!r}.")
    if not buckets or any(b < 0 for b in buckets):
        raise SystemExit(f"error: --buckets needs values >= 0. Received: {args.buckets!r}.")
    if 0.0 not in buckets:
        buckets = [0.0, *buckets]  # the side-by-side reference
    left_out = []
    if link:
        args.workers = args.hosts
        if "shm" in engines:
            engines.remove("shm")
            left_out.append("shm: one host's shared memory, not run across hosts")
        if args.cpu_bind != "none":
            raise SystemExit("error: --cpu-bind applies to workers on one host. Received: "
                             f"--cpu-bind {args.cpu_bind} --hosts {args.hosts}.")
    if args.workers < 2:
        raise SystemExit(f"error: overlap needs -n >= 2. Received: -n {args.workers}.")
    if "horovod" in engines and runs.horovod_venv(args.venv) is None:
        raise SystemExit("error: --engines horovod needs the Horovod venv. "
                         "HINT: run scripts/install_horovod.sh")
    configs = configurations(engines, compressions, buckets)
    results = {}
    with (on_hosts.shaped_hosts(args.hosts, args.rate) if link
          else contextlib.nullcontext()) as hosts:
        for recipe in [r for r in args.recipes.split(",") if r]:
            results[recipe] = _measure_recipe(args, recipe, configs, hosts)
    where = (f"worker i on namespaced host hi, links shaped to {args.rate}" if link
             else "all workers on one host")
    return {"workers": args.workers, "hosts": args.workers if link else 0,
            "rate": args.rate if link else None, "link_gbs": link, "results": results,
            "engines": engines, "buckets_mb": buckets, "grad_compression": compressions,
            "per_worker_batch": args.per_worker_batch, "steps": args.steps,
            "warmup_steps": args.warmup, "repeats": args.repeats, "threads": args.threads,
            "inter_op_threads": args.inter_op_threads, "cpu_bind": args.cpu_bind,
            "left_out": left_out,
            "note": f"medians over repeats; {where}; floor = max(compute, all-reduce); "
                    "vs no buckets = throughput over the same engine and compression with "
                    "--bucket-mb 0, paired by repeat (>1: faster)"}


def _measure_recipe(args, recipe: str, configs, hosts) -> dict:
    grad_bytes = scaling._grad_bytes(recipe)
    pairs = sorted({(e, c) for e, c, _ in configs})
    compute, comm = [], {p: [] for p in pairs}
    steps = {cfg: [] for cfg in configs}
    loads = []
    run_args = argparse.Namespace(**{**vars(args), "hosts_cluster": hosts, "train_flags": ""})
    per = args.per_worker_batch
    for rep in range(max(1, args.repeats)):
        loads.append(runs.load_average())
        compute.append(scaling.one_run(run_args, recipe, "single", 1, per,
                                       f"overlap_{recipe}_compute_r{rep}")["step_s"])
        for engine, comp in pairs:
            comm[(engine, comp)].append(_allreduce_s(args, engine, wire_bytes(grad_bytes, comp),
                                                     hosts))
        for engine, comp, bucket in configs:
            flags = "" if bucket is None else f"--bucket-mb {bucket:g}"
            one = argparse.Namespace(**{**vars(run_args), "train_flags": flags})
            label = f"overlap_{recipe}_{config_name(engine, comp, bucket)}_r{rep}"
            steps[(engine, comp, bucket)].append(scaling.one_run(
                one, recipe, engine, args.workers, per * args.workers,
                label.replace(" @", "_b").replace("+", "_"), comp)["step_s"])
    rows = []
    for engine, comp, bucket in configs:
        base = (steps[(engine, comp, 0.0)] if bucket not in (None, 0.0) else None)
        rows.append({"engine": engine, "grad_compression": comp, "bucket_mb": bucket,
                     "name": config_name(engine, comp, bucket),
                     "wire_bytes": wire_bytes(grad_bytes, comp),
                     **summarize(compute, comm[(engine, comp)], steps[(engine, comp, bucket)],
                                 base)})
    return {"grad_bytes": grad_bytes, "compute_tries_s": compute,
            "allreduce_tries_s": {config_name(e, c, None): v for (e, c), v in comm.items()},
            "load_avg_1m": loads, "rows": rows}


def _allreduce_s(args, engine: str, nbytes: int, hosts) -> float:
    """Median seconds of one all-reduce of `nbytes` (one float32 tensor) by `engine`."""
    label, name = f"all-reduce only, {engine}", ALLREDUCE_ENGINE[engine]
    variant = (label, name, args.controller if name == "horovod" else None,
               {"mwms": {"bytes_per_pack": 0}, "shm": {"chunk_bytes": 4 << 20}}.get(name, {}), "")
    spec = argparse.Namespace(iters=args.allreduce_iters, threads=args.threads,
                              ranks=args.workers, timeout=args.timeout,
                              venv_path=runs.horovod_venv(args.venv))
    seconds, _ = allreduce._measure(variant, spec, [nbytes / 1e6], hosts)
    return seconds[0]


def table(result: dict) -> str:
    """One row per recipe and configuration."""
    from tfdist.bench.report import format_table

    rows = []
    for recipe, r in result["results"].items():
        for row in r["rows"]:
            vs = row.get("vs_no_buckets")
            rows.append([recipe, row["name"], row["wire_bytes"] / 1e6, row["compute_s"] * 1e3,
                         row["allreduce_s"] * 1e3, row["floor_s"] * 1e3, row["serial_s"] * 1e3,
                         row["step_s"] * 1e3, row["step_over_floor"],
                         "" if vs is None else f"{vs:.3f}"])
    head = ["recipe", "configuration", "wire MB", "compute ms", "all-reduce ms", "floor ms",
            "compute+all-reduce ms", "step ms", "step / floor", "vs no buckets"]
    where = (f"{result['workers']} workers, one per namespaced host, links {result['rate']}"
             if result["hosts"] else f"{result['workers']} workers on one host")
    out = (f"{where}; {result['repeats']} repeat(s), medians; floor = max(compute, all-reduce)\n"
           + format_table(head, rows))
    for line in result.get("left_out", []):
        out += f"\nleft out: {line}"
    return out


def plot(result: dict, fig) -> None:
    """Per recipe: each configuration's step beside its floor and compute + all-reduce."""
    recipes = list(result["results"])
    axes = fig.subplots(1, max(1, len(recipes)), squeeze=False)[0]
    for ax, recipe in zip(axes, recipes):
        rows = result["results"][recipe]["rows"]
        xs = range(len(rows))
        ax.bar([x - 0.27 for x in xs], [r["floor_s"] * 1e3 for r in rows], 0.27,
               label="floor max(compute, all-reduce)", color="#9ecae1")
        ax.bar(list(xs), [r["step_s"] * 1e3 for r in rows], 0.27, label="measured step",
               color="#3182bd")
        ax.bar([x + 0.27 for x in xs], [r["serial_s"] * 1e3 for r in rows], 0.27,
               label="compute + all-reduce (no overlap)", color="#fdae6b")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([r["name"] for r in rows], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("ms per step")
        where = f"links {result['rate']}" if result["hosts"] else "one host"
        ax.set_title(f"{recipe}: {result['workers']} workers, {where}")
        ax.legend(fontsize=7)
    fig.set_size_inches(max(6, 3 + 1.2 * sum(len(result["results"][r]["rows"])
                                             for r in recipes)), 5)
    fig.tight_layout()

