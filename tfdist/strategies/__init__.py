"""Strategy adapters ("how to train"), one class per file, behind `build_strategy`.

Each adapter is a subclass of `Adapter` registered by class (`@register`):
it declares its name, the strategy-specific options it accepts, the general
options it cannot honour, its pre-TensorFlow checks, its loop kind, and how
it builds its `tf.distribute.Strategy` and its trainer `Hooks`. The run
pipeline (`tfdist.run.trainer`) asks the adapter and names no strategy.

Adapter modules import no TensorFlow and no engine (Horovod, the shared-memory
engine) at module level, so registering them all costs nothing and choosing
one never imports the others' dependencies.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from tfdist.errors import ConfigError

# name -> adapter class, in the order `valid_names` lists them; filled by `register`
# as the adapter modules are imported at the bottom of this file.
REGISTRY: dict[str, type["Adapter"]] = {}
ALIASES = ("auto",)


@dataclasses.dataclass(frozen=True)
class StrategyOptions:
    """Options every adapter may read; their defaults are the command line's too
    (`tfdist.config` takes them from here: `adapter_default`).

    Attributes:
        devices: Local replicas (GPUs, else logical CPUs); None for all.
        collective: MWMS collective implementation: "auto", "ring", "nccl".
        timeout_s: Collective timeout in seconds, so a dead peer ends the job.
        microbatches: Micro-batches per batch (pipeline).
        schedule: The pipeline schedule, "gpipe" or "1f1b".
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
    """

    devices: int | None = None
    collective: str = "auto"
    timeout_s: float | None = 60.0
    microbatches: int = 1
    schedule: str = "gpipe"
    placement: str = ""
    tensor_parallel: int = 1
    stages: int = 0

    ps_shards: int = 0
    min_shard_bytes: int = 256 << 10
    startup_timeout_s: float = 300.0
    grad_compression: str = "none"

# The options adapters accept (`Adapter.accepts`) -> the StrategyOptions field
# each fills: the adapters' own section of the configuration.
OPTION_FIELDS: dict[str, str] = {
    "devices": "devices", "collective": "collective", "collective_timeout_s": "timeout_s",
    "startup_timeout_s": "startup_timeout_s", "grad_compression": "grad_compression",
    "microbatches": "microbatches", "schedule": "schedule", "placement": "placement",
    "tensor_parallel": "tensor_parallel", "stages": "stages", "ps_shards": "ps_shards",
    "min_shard_bytes": "min_shard_bytes"}


def adapter_default(key: str):
    """The default of adapter option `key` (e.g. "collective_timeout_s"): its
    `StrategyOptions` field's, the one declaration (devices: 0, meaning all)."""
    field = {f.name: f for f in dataclasses.fields(StrategyOptions)}[OPTION_FIELDS[key]]
    return 0 if key == "devices" else field.default


class Hooks:
    """What an adapter may change in the trainer; these defaults change nothing.

    An adapter whose `hooks()` changes something returns a subclass (Horovod
    does: its replicas are processes TensorFlow never sees).
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

    def collectives(self, strategy):
        """The job's `tfdist.collectives.HostCollectives` (one per run, built on first use)."""
        if getattr(self, "_collectives", None) is None:
            self._collectives = self._make_collectives(strategy)
        return self._collectives

    def _make_collectives(self, strategy):
        """The strategy's own processes' collectives (MultiWorkerMirrored's, or one process)."""
        from tfdist import collectives

        return collectives.for_strategy(strategy)

    def any_worker(self, strategy, flag: bool) -> bool:
        """True on every process when `flag` is True on any (preemption agreement)."""
        return self.collectives(strategy).any_true(flag)

    def lost_peer(self, strategy, error: BaseException):
        """The `PeerLostError` (with rank) that `error` means, when the engine can tell; else None."""
        return self.collectives(strategy).lost_peer(error)

    def compile_kwargs(self) -> dict:
        """Extra `model.compile` arguments the adapter needs (e.g. no XLA)."""
        return {}

    def build_model(self, build):
        """The recipe's model: `build()`, in the strategy's scope.

        An adapter that places each weight itself (pipeline stages in processes
        of their own) builds it without values, so this process never holds
        the whole model.
        """
        return build()

    def transform_model(self, model):
        """The model to train, from the recipe's (model parallelism splits it)."""
        return model

    def callbacks(self, learning_rate: float, warmup_epochs: float = 0.0) -> list:
        """Extra Keras callbacks for `fit`, run before the trainer's own.

        Args:
            learning_rate: The run's (scaled) learning rate.
            warmup_epochs: --warmup-epochs (engines with one replica per process).
        """
        return []


class ProcessReplicaHooks(Hooks):
    """Hooks of engines with one replica per process that TensorFlow never sees.

    Horovod and shm: the cluster's workers are the replicas, each reads its
    shard, the optimizer allreduces, and the callbacks (written once, on the
    engine's host collectives) broadcast rank 0's state, average metrics and
    (with --warmup-epochs) ramp the learning rate from lr/size. Subclasses
    supply `_distributed`, `_all_true` and `_engine_collectives`.
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

    def callbacks(self, learning_rate, warmup_epochs=0.0):
        # Broadcast first (no other callback may see a rank's own init), then metrics.
        from tfdist.collectives import keras_callbacks

        engine = lambda: self.collectives(None)  # noqa: E731
        out = [keras_callbacks.BroadcastInitialState(engine, root=0),
               keras_callbacks.MetricAverage(engine)]
        if warmup_epochs:
            # Goyal et al.'s ramp (the callback needs Horovod only when no size is given).
            from tfdist.horovod.lr_callbacks import LearningRateWarmup

            size = self.cluster.num_workers
            out.append(LearningRateWarmup(learning_rate / size, warmup_epochs, size=size))
        return out

    def _distributed(self, optimizer):  # pragma: no cover - interface
        """The engine's DistributedOptimizer around `optimizer`."""
        raise NotImplementedError

    def _all_true(self, flag):  # pragma: no cover - interface
        """True on every rank when the scalar boolean tensor `flag` is True on all."""
        raise NotImplementedError

    def _make_collectives(self, strategy):
        return self._engine_collectives()

    def _engine_collectives(self):  # pragma: no cover - interface
        """The engine's `tfdist.collectives.HostCollectives`."""
        raise NotImplementedError



class Adapter:
    """One way to train: a subclass per strategy, one per file, registered by class.

    Class attributes declare what the run pipeline needs before TensorFlow
    starts; an instance (made after TensorFlow starts, with the cluster and
    the options) builds the strategy and the hooks.

    Attributes:
        name: The `--strategy` name.
        loop: "fit" (Keras `fit` on every training process) or "coordinator"
            (the chief schedules steps on workers; `tfdist.ps`).
        accepts: Strategy-specific options this adapter accepts (keys of
            `tfdist.config.OPTIONS`); an option some adapter lists applies
            only to the adapters that list it.
        refuses: General options this adapter cannot honour, key -> (the one
            value it runs with, why); they apply to every other adapter, and
            any other value (from the command line or a recipe) is refused
            before TensorFlow starts.
        process_replicas: One replica per process that TensorFlow never sees
            (the cluster's workers are the replicas; `--warmup-epochs`).
        sync_workers: The cluster's workers share each global batch
            synchronously, so it must divide by their number.
        portable: Synchronous training: the same math on any number of
            replicas or stages at one global batch, so a backup resumes under
            any other portable adapter (`tfdist.run.run_dir`).
        one_process: Trains in one process; refused as one task of several
            (each would train alone, unsynchronised).
    """

    name: ClassVar[str] = ""
    loop: ClassVar[str] = "fit"
    accepts: ClassVar[tuple[str, ...]] = ()
    refuses: ClassVar[dict[str, tuple[object, str]]] = {}
    process_replicas: ClassVar[bool] = False
    sync_workers: ClassVar[bool] = False
    portable: ClassVar[bool] = False
    one_process: ClassVar[bool] = False

    def __init__(self, cluster, options: StrategyOptions | None = None):
        self.cluster = cluster
        self.options = options or StrategyOptions()

    @classmethod
    def check_available(cls) -> None:
        """Raises ConfigError when an optional dependency is missing (no TensorFlow)."""

    @classmethod
    def check_config(cls, settings, cluster) -> None:
        """Pre-TensorFlow checks of the run's `tfdist.settings.Settings` on this cluster (pure).

        Raises:
            ConfigError: for values this adapter cannot train with.
            ClusterError: for a cluster it cannot run on.
        """
        from tfdist.option import flag

        cls.check_cluster(cluster)
        for key, (only, why) in cls.refuses.items():
            value = settings.value(key)
            if value != only:
                raise ConfigError(f"{flag(key)} does not apply to --strategy {cls.name}: {why}. "
                                  f"Received: {flag(key)} {value!r}. Drop it (the run needs "
                                  f"{flag(key)} {only!r}), or use another strategy.")
        warmup_epochs = settings.optimization.warmup_epochs
        if warmup_epochs and not cls.process_replicas:
            ramped = ", ".join(n for n, a in REGISTRY.items() if a.process_replicas)
            raise ConfigError(
                f"--warmup-epochs (Goyal et al.'s ramp from lr/size to lr) applies to "
                f"strategies that run one replica per process ({ramped}). Received: "
                f"--warmup-epochs {warmup_epochs} with --strategy {cls.name}. Use "
                "--warmup-steps N, which works under every strategy.")
        if cls.sync_workers and cluster.is_multi_worker:
            from tfdist import data

            data.per_replica_batch_size(settings.training.global_batch_size, cluster.num_workers)

    @classmethod
    def check_cluster(cls, cluster) -> None:
        """Pre-TensorFlow checks of the cluster alone (pure); `check_config` runs them too.

        Raises:
            ConfigError: for a one-process strategy started as one task of several.
        """
        if cls.one_process and cluster.num_tasks > 1:
            together = ", ".join(together_names(cluster))
            raise ConfigError(
                f"--strategy {cls.name} trains in one process, but this process is one of "
                f"{cluster.num_tasks} tasks started by {cluster.origin}: each would train "
                f"alone. Use a strategy that trains the tasks together ({together}), or run "
                f"one process.")

    @classmethod
    def runs_loop(cls, cluster) -> bool:
        """Whether this process runs the training loop (and owns the run dir's reads)."""
        return True

    def startup_note(self) -> str | None:
        """A line to print before `build` blocks (waiting for peers), or None.

        A strategy that trains several processes together says, when it finds
        no cluster, that it trains as one.
        """
        if self.sync_workers and not self.cluster.is_multi_worker:
            return (f"--strategy {self.name}: no cluster found (no TF_CONFIG, Slurm task or "
                    "horovodrun rank), so this process trains as one worker; start N workers "
                    f"with python -m tfdist.launch -n N -- COMMAND")
        return None

    def build(self):
        """The `tf.distribute.Strategy` (after TensorFlow started, before any op)."""
        raise NotImplementedError

    def hooks(self) -> Hooks:
        """What this adapter changes in the trainer (the defaults change nothing)."""
        return Hooks()


def together_names(cluster) -> list[str]:
    """Pure function: the strategies that train this cluster's tasks together.

    Horovod's ranks come from horovodrun or mpirun; the others read TF_CONFIG
    or Slurm; parameter_server needs ps tasks in the cluster.
    """
    if cluster.source == "horovod":
        return [n for n, a in REGISTRY.items() if a.sync_workers and n == "horovod"]
    names = [n for n, a in REGISTRY.items() if a.sync_workers and n != "horovod"]
    return names + (["parameter_server"] if has_ps_tasks(cluster) else [])


def register(cls: type[Adapter]) -> type[Adapter]:
    """Class decorator: adds an adapter to `REGISTRY` under its `name`."""
    if not cls.name or cls.name in REGISTRY or cls.name in ALIASES:
        raise ValueError(f"adapter {cls.__name__}: name {cls.name!r} is empty or taken")
    REGISTRY[cls.name] = cls
    return cls


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
    devices: int | None

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


def choose(name: str, cluster, devices: int | None) -> Choice:
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


__all__ = ["ALIASES", "Adapter", "Choice", "REGISTRY", "Hooks", "ProcessReplicaHooks",
           "StrategyOptions", "accepting", "adapter_class", "build", "build_hooks",
           "build_strategy", "OPTION_FIELDS", "check_available", "check_name", "choose",
           "has_ps_tasks", "together_names",
           "possible_names", "refusal", "refused_by", "register", "resolve_name", "valid_names"]

# Importing the adapters registers them (in this order, the order `valid_names` lists).
from tfdist.strategies import (  # noqa: E402,F401  (after Adapter and Hooks exist)
    single, mirrored, multi_worker, model_parallel, pipeline, horovod, shm, parameter_server)
