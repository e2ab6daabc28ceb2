"""The options strategy adapters read (`StrategyOptions`), each declared once, with its field.

Every field carries its `tfdist.option.Option` (default, meaning, allowed
values) and is named as the command line names it (`collective_timeout_s` is
`--collective-timeout-s`). From these fields come the command line's table
(`tfdist.config.OPTIONS`), `tfdist.setup()`'s keywords
(`tfdist.config.SCRIPT_OPTIONS`) and the adapters' section of
`tfdist.settings.Settings`, so `build_strategy`, `tfdist.setup()` and
`python -m tfdist.train` cannot disagree. Adding an adapter option is one
field here; the adapters that honour it list it in their `accepts`.
Pure Python: no TensorFlow.
"""

from __future__ import annotations

import dataclasses

from tfdist.buckets import ENGINE_DEFAULT
from tfdist.compression import NAMES as COMPRESSIONS
from tfdist.model_parallel.schedules import NAMES as PIPELINE_SCHEDULES
from tfdist.option import Option
from tfdist.zero.partition import LEVELS as SHARD_LEVELS

IMPLEMENTATIONS = ("auto", "ring", "nccl")  # MultiWorkerMirroredStrategy's collectives


def _declared(option: Option):
    """A dataclass field whose default is `option`'s, carrying `option` itself."""
    return dataclasses.field(default=option.default, metadata={"option": option})


@dataclasses.dataclass(frozen=True)
class StrategyOptions:
    """Options every adapter may read, with the command line's names and defaults.

    A value given as None takes the field's default (as in `tfdist.setup()`).
    Which adapters honour an option is their `accepts`; the `--help` text of each
    is its `Option`.

    Attributes:
        devices: Local replicas (GPUs, else logical CPUs); 0 for all.
        collective: MWMS collective implementation: "auto", "ring", "nccl".
        collective_timeout_s: Seconds after which a collective (or a pipeline
            step) whose peer is silent ends the job.
        startup_timeout_s: multi_worker: how long a worker waits for its peers
            to come up (0: for ever).
        grad_compression: "none", "fp16" or "bf16": gradients cast for the
            all-reduce and back (data-parallel strategies; `tfdist.compression`).
        bucket_mb: Gradient all-reduce buckets of about this many MB, in
            reverse layer order, each started as soon as its gradients exist,
            while the backward pass goes on (multi_worker, shm); 0: one
            all-reduce after the whole backward pass; -1: the engine's measured
            default (`tfdist.buckets.ENGINE_DEFAULTS_MB`).
        microbatches: Micro-batches per batch (pipeline).
        schedule: The pipeline schedule, "gpipe", "1f1b", "interleaved", "zb",
            or "auto" (the planner's fastest predicted that fits memory).
        virtual_stages: Chunks of the model each pipeline stage holds
            (V, interleaved schedule only; under "auto", the V interleaving is
            offered with, 2 when 1).
        balance: Where the pipeline's cuts go: "parameters" (even parameter
            counts) or "time" (even measured per-layer time, from the
            planner's short profile pass).
        placement: "a,b=/cpu:0;c=/cpu:1" layer groups on devices (model_parallel,
            pipeline); empty for an even split over `devices`.
        stages: Pipeline stages across processes (0: one per task).
        tensor_parallel: Devices per stage (model_parallel, pipeline): each
            stage's attention and feed-forward layers split over them
            (`tfdist.model_parallel.tensor_parallel`); `devices` is P*T.
        ps_shards: parameter_server: split large variables into up to this many
            shards across the ps tasks (0 or 1: no partitioning).
        min_shard_bytes: parameter_server: smallest shard worth splitting off.
        shard: What each data-parallel worker keeps only its share of:
            "none", "optimizer" (the optimizer state, ZeRO-1), "gradients"
            (and the reduced gradients and accumulators, ZeRO-2) or
            "parameters" (and its rows of every weight, ZeRO-3); multi_worker,
            shm, horovod (`tfdist.zero`).
        shard_optimizer_state: The spelled-out `shard="optimizer"`.
    """

    devices: int = _declared(Option(
        0, "local replicas: GPUs, else the CPU split into N logical devices (0: all/auto)",
        ge=0, le=1024))
    collective: str = _declared(Option(
        "auto", "MultiWorkerMirroredStrategy collective implementation",
        choices=IMPLEMENTATIONS))
    # setup() once took it as `timeout_s`; a caller using that name is told this one.
    collective_timeout_s: float = _declared(Option(
        60.0, "seconds after which a collective (or a pipeline step) whose peer is silent "
        "ends the job (a lost host is noticed in ~10 s)", gt=0, old_names=("timeout_s",)))
    startup_timeout_s: float = _declared(Option(
        300.0, "seconds a worker waits for its peers to start before the job ends (0: for "
        "ever)", ge=0))
    grad_compression: str = _declared(Option(
        "none", "cast floating gradients for the all-reduce and back (fp16, bf16: half the "
        "bytes on the wire)", choices=COMPRESSIONS))
    bucket_mb: float = _declared(Option(
        ENGINE_DEFAULT, "gradient all-reduce buckets of about this many MB, from the last "
        "layer back, each started while the backward pass goes on (0: one all-reduce after "
        "the backward pass; -1: the engine's measured default, multi_worker 4, shm 0)",
        ge=-1, le=4096))
    shard: str = _declared(Option(
        "none", "what each worker keeps only its 1/N of: optimizer (the optimizer state, "
        "ZeRO-1), gradients (and the reduced gradients and accumulators, ZeRO-2), "
        "parameters (and the weights, ZeRO-3); each level includes the one "
        "before (docs/zero.md)", choices=SHARD_LEVELS))
    shard_optimizer_state: bool = _declared(Option(
        False, "the spelled-out --shard optimizer"))
    microbatches: int = _declared(Option(1, "micro-batches per batch (pipeline)", ge=1))
    schedule: str = _declared(Option(
        "gpipe", "pipeline schedule: gpipe (all forwards, then all backwards), 1f1b (at most "
        "P micro-batches' activations per stage), interleaved (V chunks a stage, "
        "--virtual-stages), zb (zero bubble: weight gradients fill the bubble) or auto (the "
        "planner's fastest predicted schedule that fits each process's memory)",
        choices=(*PIPELINE_SCHEDULES, "auto")))
    virtual_stages: int = _declared(Option(
        1, "chunks of the model each pipeline stage holds (--schedule interleaved; under "
        "auto, the V interleaving is offered with, 2 when 1)", ge=1))
    balance: str = _declared(Option(
        "parameters", "pipeline cuts: parameters (even parameter counts) or time (even "
        "per-layer time, measured by a short profile pass before the first step)",
        choices=("parameters", "time")))
    placement: str = _declared(Option(
        "", "layer groups on devices, e.g. 'a,b=/cpu:0;c=/cpu:1' (default: an even split "
        "over --devices)"))
    stages: int = _declared(Option(
        0, "pipeline across processes: stages (0: one per task of the job)", ge=0))
    tensor_parallel: int = _declared(Option(
        1, "devices per stage (model_parallel, pipeline): attention split by heads, "
        "feed-forward Dense pairs by units; --devices must be P*N for P stages", ge=1))
    ps_shards: int = _declared(Option(
        0, "variable partitioning over the ps tasks (>1 refused: Keras 3)", ge=0))
    min_shard_bytes: int = _declared(Option(256 << 10, "smallest variable shard", ge=1))

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if getattr(self, f.name) is None:
                object.__setattr__(self, f.name, f.default)


# key -> its declaration, in field order: what the option table, setup() and Settings read.
ADAPTER_OPTIONS: dict[str, Option] = {
    f.name: f.metadata["option"] for f in dataclasses.fields(StrategyOptions)}
for _key, _option in ADAPTER_OPTIONS.items():
    _option.name = _key
