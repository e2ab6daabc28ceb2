"""Strategy adapters ("how to train"), one per file, behind `build_strategy`.

Adapters are imported lazily by name so that choosing one never imports the
others' dependencies (Horovod, for instance).
"""

from __future__ import annotations

import dataclasses
import importlib

from tfdist.errors import ConfigError

# name -> module implementing `build(cluster, options) -> tf.distribute.Strategy`
REGISTRY: dict[str, str] = {
    "single": "tfdist.strategies.single",
    "mirrored": "tfdist.strategies.mirrored",
    "multi_worker": "tfdist.strategies.multi_worker",
    "model_parallel": "tfdist.strategies.model_parallel",
    "pipeline": "tfdist.strategies.pipeline",
    "horovod": "tfdist.strategies.horovod",
    "shm": "tfdist.strategies.shm",
    "parameter_server": "tfdist.strategies.parameter_server",
}
ALIASES = ("auto",)


@dataclasses.dataclass(frozen=True)
class StrategyOptions:
    """Options every adapter may read.

    Attributes:
        devices: Local replicas (GPUs, else logical CPUs); None for all.
        collective: MWMS collective implementation: "auto", "ring", "nccl".
        timeout_s: Collective timeout in seconds, so a dead peer ends the job.
        microbatches: Micro-batches per batch (pipeline).
        placement: "a,b=/cpu:0;c=/cpu:1" layer groups on devices (model_parallel,
            pipeline); empty for an even split over `devices`.
        ps_shards: parameter_server: split large variables into up to this many
            shards across the ps tasks (0 or 1: no partitioning).
        min_shard_bytes: parameter_server: smallest shard worth splitting off.
        startup_timeout_s: multi_worker: how long a worker waits for its peers
            to come up (0: for ever).
        grad_compression: "none", "fp16" or "bf16": gradients cast for the
            all-reduce and back (data-parallel strategies; `tfdist.compression`).
    """

    devices: int | None = None
    collective: str = "auto"
    timeout_s: float | None = 60.0  # as config.DEFAULTS["collective_timeout_s"]
    microbatches: int = 1
    placement: str = ""

    ps_shards: int = 0
    min_shard_bytes: int = 256 << 10
    startup_timeout_s: float = 300.0
    grad_compression: str = "none"

class Hooks:
    """What an adapter may change in the trainer; these defaults change nothing.

    An adapter module with a `hooks(cluster, options)` function returns a
    subclass (Horovod does: its replicas are processes TensorFlow never sees).
    """

    def num_replicas(self, strategy) -> int:
        """Replicas that share each global batch."""
        return strategy.num_replicas_in_sync

    def input_shard(self) -> tuple[int, int] | None:
        """(num_shards, index) when this process must read only its shard."""
        return None

    def wrap_optimizer(self, optimizer):
        """The optimizer to compile with."""
        return optimizer

    def any_worker(self, strategy, flag: bool) -> bool:
        """True on every process when `flag` is True on any (preemption agreement)."""
        if getattr(self, "_agreement", None) is None:  # one compiled collective per run
            from tfdist.preemption import make_agreement

            self._agreement = make_agreement(strategy)
        return self._agreement(flag)

    def compile_kwargs(self) -> dict:
        """Extra `model.compile` arguments the adapter needs (e.g. no XLA)."""
        return {}

    def transform_model(self, model):
        """The model to train, from the recipe's (model parallelism splits it)."""
        return model

    def callbacks(self, cfg: dict, learning_rate: float) -> list:
        """Extra Keras callbacks for `fit`, run before the trainer's own."""
        return []


class ProcessReplicaHooks(Hooks):
    """Hooks of engines with one replica per process that TensorFlow never sees.

    Horovod and shm: the cluster's workers are the replicas, each reads its
    shard, the optimizer allreduces, and the engine's callbacks broadcast
    rank 0's state, average metrics and (with --warmup-epochs) ramp the
    learning rate from lr/size. Subclasses supply `_distributed`, `_all_true`
    and `_engine_callbacks`.
    """

    def __init__(self, cluster, grad_compression: str = "none"):
        self.cluster = cluster
        self.grad_compression = grad_compression

    def num_replicas(self, strategy) -> int:
        return self.cluster.num_workers

    def input_shard(self):
        return (self.cluster.num_workers, self.cluster.worker_index)

    def wrap_optimizer(self, optimizer):
        from tfdist import allreduce_optimizer

        distributed = allreduce_optimizer.with_compression(self._distributed(optimizer),
                                                           self.grad_compression)
        return allreduce_optimizer.loss_scale_if_float16(distributed, self._all_true)

    def callbacks(self, cfg, learning_rate):
        out = self._engine_callbacks()
        if cfg.get("warmup_epochs"):
            # Goyal et al.'s ramp (the callback needs Horovod only when no size is given).
            from tfdist.horovod.lr_callbacks import LearningRateWarmup

            size = self.cluster.num_workers
            out.append(LearningRateWarmup(learning_rate / size, cfg["warmup_epochs"], size=size))
        return out

    def _distributed(self, optimizer):  # pragma: no cover - interface
        """The engine's DistributedOptimizer around `optimizer`."""
        raise NotImplementedError

    def _all_true(self, flag):  # pragma: no cover - interface
        """True on every rank when the scalar boolean tensor `flag` is True on all."""
        raise NotImplementedError

    def _engine_callbacks(self) -> list:  # pragma: no cover - interface
        """Broadcast first (no other callback may see a rank's own init), then metrics."""
        raise NotImplementedError


def build_hooks(name: str, cluster, options: StrategyOptions | None = None) -> Hooks:
    """The trainer hooks of a concrete adapter (`Hooks()` when it has none)."""
    module = importlib.import_module(REGISTRY[name])
    factory = getattr(module, "hooks", None)
    return factory(cluster, options or StrategyOptions()) if factory else Hooks()


def check_available(name: str) -> None:
    """Raises ConfigError when an adapter's optional dependency is missing.

    Imports no TensorFlow, so the CLI fails before TensorFlow starts.
    """
    check_name(name)
    if name in REGISTRY:
        check = getattr(importlib.import_module(REGISTRY[name]), "check_available", None)
        if check:
            check()


def valid_names() -> list[str]:
    """Names `build_strategy` accepts."""
    return [*ALIASES, *REGISTRY]


def check_name(name: str) -> None:
    """Raises ConfigError for an unknown strategy name (no TensorFlow needed)."""
    if name not in valid_names():
        raise ConfigError(f"Unknown strategy {name!r}. Valid strategies: {valid_names()}.")


def resolve_name(name: str, cluster, devices: int | None, gpus: int = 0) -> str:
    """Pure function: the concrete adapter name for `name` ("auto" resolved).

    auto -> horovod when `horovodrun` started this process, parameter_server
    when the cluster has ps tasks, multi_worker when it has several workers,
    else mirrored when several local devices are asked for or present, else
    single.
    """
    check_name(name)
    if name != "auto":
        return name
    if cluster.source == "horovod":
        return "horovod"
    if has_ps_tasks(cluster):
        return "parameter_server"
    if cluster.is_multi_worker:
        return "multi_worker"
    local = devices if devices is not None else gpus
    return "mirrored" if local > 1 else "single"


def possible_names(name: str, cluster, devices: int | None) -> set[str]:
    """Pure function: the adapters `name` may resolve to before TensorFlow counts GPUs."""
    return {resolve_name(name, cluster, devices, gpus) for gpus in (0, 2)}


def has_ps_tasks(cluster) -> bool:
    """Pure function: True when the cluster spec lists parameter servers."""
    return bool(cluster is not None and cluster.tf_config
                and cluster.tf_config.get("cluster", {}).get("ps"))


def build_strategy(name: str, cluster=None, options: StrategyOptions | None = None):
    """Builds a `tf.distribute.Strategy` by adapter name.

    Applies tfdist's upstream workarounds (tfdist.compat) first, so that Keras
    `fit`, `evaluate` and `predict` work under whatever is returned.

    Args:
        name: One of `valid_names()`.
        cluster: A `tfdist.cluster.ClusterInfo`; discovered when None.
        options: StrategyOptions; defaults when None.

    Returns:
        The strategy.

    Raises:
        ConfigError: for an unknown name or impossible options.
    """
    from tfdist import cluster as cluster_lib
    from tfdist import compat
    from tfdist.strategies.devices import gpu_count

    check_name(name)
    cluster = cluster or cluster_lib.detect()
    options = options or StrategyOptions()
    concrete = resolve_name(name, cluster, options.devices, gpu_count())
    compat.apply_all()
    module = importlib.import_module(REGISTRY[concrete])
    return module.build(cluster, options)


__all__ = ["REGISTRY", "Hooks", "ProcessReplicaHooks", "StrategyOptions", "build_hooks", "build_strategy",
           "check_available", "check_name", "has_ps_tasks", "possible_names", "resolve_name", "valid_names"]
