"""Choosing an adapter by name: valid names, what `auto` resolves to, which adapters
an option applies to, and building the chosen one's strategy."""

from __future__ import annotations

import dataclasses

from tfdist.errors import ConfigError
from tfdist.strategies.adapter import ALIASES, REGISTRY, Adapter, has_ps_tasks
from tfdist.strategies.hooks import Hooks
from tfdist.strategies.options import StrategyOptions


def adapter_class(name: str) -> type[Adapter]:
    """The adapter class of a concrete name (not "auto").

    Raises:
        ConfigError: for an unknown name.
    """
    check_name(name)
    if name not in REGISTRY:
        raise ConfigError(f"{name!r} is resolved by `resolve_name`, not an adapter itself.")
    return REGISTRY[name]


def accepting(key: str) -> tuple[str, ...] | None:
    """The strategies an option applies to, from the adapters' declarations (None: all).

    An option an adapter lists in `accepts` applies only to the adapters that
    list it; one an adapter `refuses` applies to all the others.
    """
    listed = tuple(n for n, a in REGISTRY.items() if key in a.accepts)
    if listed:
        return listed
    if any(key in a.refuses for a in REGISTRY.values()):
        return tuple(n for n, a in REGISTRY.items() if key not in a.refuses)
    return None


def refused_by(key: str) -> tuple[str, ...]:
    """The adapters that cannot honour option `key` (their `refuses`)."""
    return tuple(n for n, a in REGISTRY.items() if key in a.refuses)


def refusal(key: str, names) -> str | None:
    """Why the first of the adapters `names` that refuses option `key` does, or None."""
    for name in names:
        if name in REGISTRY and key in REGISTRY[name].refuses:
            return REGISTRY[name].refuses[key][1]
    return None


def build_hooks(name: str, cluster, options: StrategyOptions | None = None) -> Hooks:
    """The trainer hooks of a concrete adapter (`Hooks()` when it changes nothing)."""
    return adapter_class(name)(cluster, options).hooks()


def check_available(name: str) -> None:
    """Raises ConfigError when an adapter's optional dependency is missing.

    Imports no TensorFlow, so the CLI fails before TensorFlow starts.
    """
    check_name(name)
    if name in REGISTRY:
        REGISTRY[name].check_available()


def valid_names() -> list[str]:
    """Names `build_strategy` accepts."""
    return [*ALIASES, *REGISTRY]


def check_name(name: str) -> None:
    """Raises ConfigError for an unknown strategy name (no TensorFlow needed)."""
    if name not in valid_names():
        raise ConfigError(f"Unknown strategy {name!r}. Valid strategies: {valid_names()}.")


def resolve_name(name: str, cluster, devices: int, gpus: int = 0) -> str:
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
    local = devices or gpus  # --devices 0: every GPU
    return "mirrored" if local > 1 else "single"


def possible_names(name: str, cluster, devices: int) -> set[str]:
    """Pure function: the adapters `name` may resolve to before TensorFlow counts GPUs."""
    return {resolve_name(name, cluster, devices, gpus) for gpus in (0, 2)}


@dataclasses.dataclass(frozen=True)
class Choice:
    """`--strategy` as asked, and the adapters it may resolve to before TensorFlow starts.

    `auto` depends on the GPUs TensorFlow will count; everything checked before
    TensorFlow is checked for every candidate, and `resolve` picks one of them.

    Attributes:
        asked: The name as given ("auto" or a concrete name).
        candidates: The adapter classes it may become, in registry order.
    """

    asked: str
    candidates: tuple[type[Adapter], ...]
    cluster: object
    devices: int

    @property
    def names(self) -> set[str]:
        """The candidates' names."""
        return {c.name for c in self.candidates}

    @property
    def loop(self) -> str:
        """The loop kind, the same for every candidate."""
        return self.candidates[0].loop

    def check_available(self) -> None:
        """Every candidate's optional dependencies (no TensorFlow)."""
        for candidate in self.candidates:
            candidate.check_available()

    def check_cluster(self) -> None:
        """Every candidate's checks of the cluster alone (pure)."""
        for candidate in self.candidates:
            candidate.check_cluster(self.cluster)

    def check_config(self, settings) -> None:
        """Every candidate's pre-TensorFlow checks of the run's `Settings`."""
        for candidate in self.candidates:
            candidate.check_config(settings, self.cluster)

    def resolve(self, gpus: int) -> type[Adapter]:
        """The one adapter, once TensorFlow has counted the GPUs."""
        return REGISTRY[resolve_name(self.asked, self.cluster, self.devices, gpus)]


def choose(name: str, cluster, devices: int) -> Choice:
    """Pure function: the `Choice` for `--strategy name` on `cluster` (no TensorFlow).

    Raises:
        ConfigError: for an unknown name.
    """
    possible = possible_names(name, cluster, devices)
    candidates = tuple(a for n, a in REGISTRY.items() if n in possible)
    if len({c.loop for c in candidates}) != 1:  # resolve_name keeps loop kinds apart
        raise AssertionError(f"{name} may resolve to adapters with different loops: {possible}")
    return Choice(name, candidates, cluster, devices)


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
    return build(name, cluster, options)[1]


def build(name: str, cluster=None, options: StrategyOptions | None = None,
          gpus: int | None = None, say=None):
    """(adapter, strategy): `name` resolved once, then built (compat applied first).

    Args:
        name: One of `valid_names()`.
        cluster: A `tfdist.cluster.ClusterInfo`; discovered when None.
        options: StrategyOptions; defaults when None.
        gpus: Physical GPUs, for `auto`; counted when None.
        say: Called with the adapter's `startup_note()`, when it has one, before
            a build that may wait for peers.
    """
    from tfdist import cluster as cluster_lib
    from tfdist import compat

    check_name(name)
    cluster = cluster or cluster_lib.detect()
    options = options or StrategyOptions()
    if gpus is None:
        from tfdist.strategies.devices import gpu_count

        gpus = gpu_count()
    adapter = REGISTRY[resolve_name(name, cluster, options.devices, gpus)](cluster, options)
    note = adapter.startup_note()
    if note and say:
        say(note)
    compat.apply_all()
    return adapter, adapter.build()
