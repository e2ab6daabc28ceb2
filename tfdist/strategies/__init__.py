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
    """

    devices: int | None = None
    collective: str = "auto"
    timeout_s: float | None = 300.0
    microbatches: int = 1
    placement: str = ""


def valid_names() -> list[str]:
    """Names `build_strategy` accepts."""
    return [*ALIASES, *REGISTRY]


def check_name(name: str) -> None:
    """Raises ConfigError for an unknown strategy name (no TensorFlow needed)."""
    if name not in valid_names():
        raise ConfigError(f"Unknown strategy {name!r}. Valid strategies: {valid_names()}.")


def resolve_name(name: str, cluster, devices: int | None, gpus: int = 0) -> str:
    """Pure function: the concrete adapter name for `name` ("auto" resolved).

    auto -> multi_worker when the cluster has several workers, else mirrored
    when several local devices are asked for or present, else single.
    """
    check_name(name)
    if name != "auto":
        return name
    if cluster.is_multi_worker:
        return "multi_worker"
    local = devices if devices is not None else gpus
    return "mirrored" if local > 1 else "single"


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


def transform_model(name: str, model, options: StrategyOptions | None = None):
    """The adapter's model transformation (model/pipeline parallelism split the model).

    Adapters without a `transform_model` return `model` unchanged.
    """
    module = importlib.import_module(REGISTRY[name])
    hook = getattr(module, "transform_model", None)
    return hook(model, options or StrategyOptions()) if hook else model


__all__ = ["REGISTRY", "StrategyOptions", "build_strategy", "check_name", "resolve_name",
           "transform_model", "valid_names"]
