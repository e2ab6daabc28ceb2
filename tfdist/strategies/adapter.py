"""The strategy adapter interface (`Adapter`) and the registry adapters join (`register`)."""

from __future__ import annotations

from typing import ClassVar

from tfdist.errors import ConfigError
from tfdist.strategies.hooks import Hooks
from tfdist.strategies.options import StrategyOptions

# name -> adapter class, in the order `valid_names` lists them; filled by `register`
# as the adapter modules are imported at the bottom of tfdist/strategies/__init__.py.
REGISTRY: dict[str, type["Adapter"]] = {}
ALIASES = ("auto",)


class Adapter:
    """One way to train: a subclass per strategy, one per file, registered by class.

    Class attributes declare what the run pipeline needs before TensorFlow
    starts; an instance (made after TensorFlow starts, with the cluster and
    the options) builds the strategy and the hooks.

    Attributes:
        name: The `--strategy` name.
        loop: The loop kind that trains (the run pipeline's `tfdist.run.trainer.LOOPS`
            holds one per kind): "fit" (Keras `fit` on every training process),
            "stages" (the chief drives a model cut into stages; other stage tasks
            serve theirs) or "coordinator" (the chief schedules steps on workers
            that serve, the variables on ps tasks). Which processes run it is
            `runs_loop`; the others `serve`.
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
    def dir_layout(cls, settings, workers: int) -> str | None:
        """The layout part of the default run dir's name (`tfdist.run.run_dir`), or None
        for the default ("-Nw" for N processes, "-Ddev" for --devices; pure).

        Args:
            settings: The run's `tfdist.settings.Settings`.
            workers: The job's training processes.
        """
        return None

    @classmethod
    def runs_loop(cls, cluster) -> bool:
        """Whether this process runs the training loop (and owns the run dir's reads);
        one that does not `serve`s."""
        return True

    def finished(self) -> None:
        """On the process that ran the loop, once the run has finished: tells the tasks
        that `serve` so, so that they end without a word (nothing by default)."""

    def serve(self, threads: int = 0):
        """This process's part where it does not run the loop (`runs_loop` False): serve
        the chief until it has ended, after TensorFlow started (never returns).

        Args:
            threads: Intra-op threads (0: TensorFlow's default).
        """
        raise NotImplementedError(f"--strategy {self.name} runs its loop on every process")

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


def has_ps_tasks(cluster) -> bool:
    """Pure function: True when the cluster spec lists parameter servers."""
    return bool(cluster is not None and cluster.tf_config
                and cluster.tf_config.get("cluster", {}).get("ps"))
