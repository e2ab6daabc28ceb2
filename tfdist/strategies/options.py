"""The options every strategy adapter may read (`StrategyOptions`), and their defaults.

The defaults declared here are the command line's too: `tfdist.config` takes
them through `adapter_default`, so `build_strategy`, `tfdist.setup()` and
`python -m tfdist.train` cannot disagree.
"""

from __future__ import annotations

import dataclasses

from tfdist.buckets import ENGINE_DEFAULT


@dataclasses.dataclass(frozen=True)
class StrategyOptions:
    """Options every adapter may read; their defaults are the command line's too
    (`tfdist.config` takes them from here: `adapter_default`).

    Attributes:
        devices: Local replicas (GPUs, else logical CPUs); None for all.
        collective: MWMS collective implementation: "auto", "ring", "nccl".
        timeout_s: Collective timeout in seconds, so a dead peer ends the job.
        microbatches: Micro-batches per batch (pipeline).
        schedule: The pipeline schedule, "gpipe", "1f1b", "interleaved" or "zb".
        virtual_stages: Chunks of the model each pipeline stage holds
            (V, interleaved schedule only).
        placement: "a,b=/cpu:0;c=/cpu:1" layer groups on devices (model_parallel,
            pipeline); empty for an even split over `devices`.
        stages: Pipeline stages across processes (0: one per task).
        tensor_parallel: Devices per stage (model_parallel, pipeline): each
            stage's attention and feed-forward layers split over them
            (`tfdist.model_parallel.tensor_parallel`); `devices` is P*T.
        ps_shards: parameter_server: split large variables into up to this many
            shards across the ps tasks (0 or 1: no partitioning).
        min_shard_bytes: parameter_server: smallest shard worth splitting off.
        startup_timeout_s: multi_worker: how long a worker waits for its peers
            to come up (0: for ever).
        grad_compression: "none", "fp16" or "bf16": gradients cast for the
            all-reduce and back (data-parallel strategies; `tfdist.compression`).
        bucket_mb: Gradient all-reduce buckets of about this many MB, in
            reverse layer order, each started as soon as its gradients exist,
            while the backward pass goes on (multi_worker, shm); 0: one
            all-reduce after the whole backward pass; -1: the engine's measured
            default (`tfdist.buckets.ENGINE_DEFAULTS_MB`).
    """

    devices: int | None = None
    collective: str = "auto"
    timeout_s: float | None = 60.0
    microbatches: int = 1
    schedule: str = "gpipe"
    virtual_stages: int = 1
    placement: str = ""
    tensor_parallel: int = 1
    stages: int = 0

    ps_shards: int = 0
    min_shard_bytes: int = 256 << 10
    startup_timeout_s: float = 300.0
    grad_compression: str = "none"
    bucket_mb: float = ENGINE_DEFAULT

# The options adapters accept (`Adapter.accepts`) -> the StrategyOptions field
# each fills: the adapters' own section of the configuration.
OPTION_FIELDS: dict[str, str] = {
    "devices": "devices", "collective": "collective", "collective_timeout_s": "timeout_s",
    "startup_timeout_s": "startup_timeout_s", "grad_compression": "grad_compression",
    "microbatches": "microbatches", "schedule": "schedule", "placement": "placement",
    "tensor_parallel": "tensor_parallel", "stages": "stages", "ps_shards": "ps_shards",
    "virtual_stages": "virtual_stages",
    "min_shard_bytes": "min_shard_bytes", "bucket_mb": "bucket_mb"}


def adapter_default(key: str):
    """The default of adapter option `key` (e.g. "collective_timeout_s"): its
    `StrategyOptions` field's, the one declaration (devices: 0, meaning all)."""
    field = {f.name: f for f in dataclasses.fields(StrategyOptions)}[OPTION_FIELDS[key]]
    return 0 if key == "devices" else field.default
