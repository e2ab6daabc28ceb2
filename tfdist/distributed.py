"""tfdist in your own script: one object that knows where this process is and how to train.

    import tfdist
    dist = tfdist.setup()               # TF_CONFIG, Slurm, horovodrun, or this machine
    with dist.scope():
        model = ...; model.compile(optimizer=dist.optimizer(opt), ...)
    model.fit(dist.shard(examples, 64), callbacks=dist.callbacks(), verbose=dist.verbose)
    dist.save(model, "runs/mine/model.keras")   # the chief writes; the others do not

In the spirit of Lightning Fabric and HF Accelerate: the script keeps its own
model, data and loop; `Distributed` holds the strategy, this process's rank,
the chief flag, a chief-only atomic save and a data helper that gives every
process its part of each global batch. It is built on `tfdist.cluster.detect()`
and `tfdist.strategies.build_strategy()`, so it applies tfdist's upstream
workarounds (Keras 3 `fit` under MultiWorkerMirroredStrategy) and works under
`tfdist.launch`, `srun`, TF_CONFIG and `horovodrun` alike.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Distributed:
    """Strategy, rank and chief flag of this process, with chief-only output.

    Build it with `tfdist.setup()` before any TensorFlow op runs.

    Attributes:
        strategy: The `tf.distribute.Strategy` (the default strategy for
            engines with one replica per process: horovod, shm).
        name: The concrete strategy name ("single", "multi_worker", ...).
        cluster: This process's `tfdist.cluster.ClusterInfo`.
        hooks: The strategy adapter's `tfdist.strategies.Hooks`.
    """

    strategy: object
    name: str
    cluster: object
    hooks: object

    @property
    def rank(self) -> int:
        """This process's index among the training processes; the chief is 0."""
        return self.cluster.worker_index

    @property
    def num_workers(self) -> int:
        """Training processes in the job."""
        return self.cluster.num_workers

    @property
    def num_replicas(self) -> int:
        """Replicas that share each global batch (all processes, all devices)."""
        return self.hooks.num_replicas(self.strategy)

    @property
    def is_chief(self) -> bool:
        """True on the one process that writes (models, logs, metrics)."""
        return self.cluster.is_chief

    @property
    def verbose(self) -> int:
        """Keras `verbose` for this process: progress bars on the chief's terminal,
        one line per epoch when its output is a pipe or file, nothing elsewhere."""
        from tfdist import config
        from tfdist.cluster import detect_console

        return config.keras_verbosity("auto", detect_console().interactive) if self.is_chief else 0

    def scope(self):
        """The strategy's scope: build and compile the model (and optimizer) inside it."""
        return self.strategy.scope()

    def per_replica_batch_size(self, global_batch_size: int) -> int:
        """`global_batch_size / num_replicas`, or a ConfigError saying why not."""
        from tfdist import data

        return data.per_replica_batch_size(global_batch_size, self.num_replicas)

    def shard(self, examples, global_batch_size: int, *, repeat: bool = True,
              training: bool = True):
        """This process's input: `examples` batched at the global batch size.

        Every step, the replicas together see exactly one global batch of
        consecutive examples, whatever the number of processes: TensorFlow
        splits it among MWMS and mirrored replicas, and under horovod or shm
        this process keeps its own slice.

        Args:
            examples: An unbatched `tf.data.Dataset` (the same on every process).
            global_batch_size: Examples per step across all replicas.
            repeat: Repeat forever (pass `steps_per_epoch` to `fit`).
            training: Drop a last partial batch, so every step is full.

        Returns:
            A batched `tf.data.Dataset` for `fit`, or for `distribute`.
        """
        from tfdist import data

        self.per_replica_batch_size(global_batch_size)
        return data.prepare(examples, global_batch_size, num_workers=self.num_workers,
                            training=training, repeat=repeat,
                            shard_by=self.hooks.input_shard() if training else None)

    def distribute(self, examples, global_batch_size: int, *, repeat: bool = True):
        """`shard`, then `strategy.experimental_distribute_dataset`: for custom loops."""
        return self.strategy.experimental_distribute_dataset(
            self.shard(examples, global_batch_size, repeat=repeat))

    def optimizer(self, optimizer):
        """The optimizer to compile with (horovod and shm wrap it in their all-reduce)."""
        return self.hooks.wrap_optimizer(optimizer)

    def model(self, model, global_batch_size: int = 0):
        """The model to compile: `model` itself, or split over devices (model_parallel, pipeline).

        Args:
            model: A built, uncompiled Keras model (build it inside `scope()`).
            global_batch_size: Examples a step, all replicas: needed by a
                pipeline's planner (`schedule="auto"`, `balance="time"`).

        Raises:
            ConfigError: when the strategy cannot split this model (one line
                naming the layer and what to do).
        """
        model = self.hooks.transform_model(model, global_batch_size=global_batch_size)
        if model.built:  # --shard parameters: each worker keeps its rows from here on
            self.hooks.split_model(model)
        return model

    def compile_kwargs(self) -> dict:
        """Extra `model.compile` arguments the strategy needs (shm: no XLA)."""
        return self.hooks.compile_kwargs()

    def callbacks(self, learning_rate: float = 0.0) -> list:
        """Callbacks `fit` needs under this strategy (horovod, shm: broadcast of the
        chief's initial state, metric averaging); empty for tf.distribute strategies."""
        return self.hooks.callbacks(learning_rate)

    def save(self, model, path: str) -> str | None:
        """Saves `model` to `path` on the chief, atomically; returns the path or None.

        Call it on every process (under MWMS saving may run collectives);
        only the chief writes.
        """
        import os

        from tfdist.writer import ChiefWriter
        from tfdist.zero import parameters

        directory, name = os.path.split(os.path.abspath(path))
        writer = ChiefWriter(directory, self.is_chief)
        every, split, served = parameters.whole_view(model.weights)
        if split is None:
            return writer.save_model(model, name)
        # --shard parameters: the chief writes each weight as the workers send its rows.
        return split.chief_writes(served, self.is_chief,
                                  lambda: _save_whole(model, every, writer, name))

    def print(self, *args, **kwargs) -> None:
        """`print` on the chief only (flushed)."""
        if self.is_chief:
            print(*args, **kwargs, flush=True)


def _save_whole(model, every, writer, name: str) -> str:
    """The chief's `Distributed.save` of a split model: Keras's file, uncompiled, each weight
    read whole (`every`: `zero.parameters.whole_view`) when Keras's writer reaches it."""
    import os

    from tfdist import final_weights as fw
    from tfdist.zero import parameters

    read = parameters.whole_values(model, every)
    architecture = model.to_json()

    def write(tmp):
        fw.save_keras(architecture, read, tmp)
        os.replace(os.path.join(tmp, fw.KERAS), os.path.join(tmp, name))
        return [name]

    (path,) = writer.write_files(write)
    return path


def setup(strategy: str = "auto", **options) -> Distributed:
    """Finds the cluster, starts TensorFlow quietly and builds the strategy.

    Call it first, before any TensorFlow op: the strategy (and CPU logical
    devices, thread pools) can only be set up before TensorFlow's runtime starts.
    It imports TensorFlow and Keras with the C++ start-up lines hidden
    (TF_CPP_MIN_LOG_LEVEL does not hide them; tfdist.compat.tf_startup_logs), as
    does a script's own import of them after `import tfdist`.

    `strategy="pipeline"` started as several tasks (tfdist.launch -n P) puts
    one stage on each: on every task but the chief, `setup()` serves its stage
    and does not return (it exits when the chief has ended), so the script's
    code after it runs on the chief, which drives every stage.

    Args:
        strategy: Any `tfdist.strategies.valid_names()` name; "auto" picks
            multi_worker under a cluster, horovod under horovodrun, mirrored
            when several local devices are asked for, else single.
        **options: The command line's options of how to train, as keywords, with
            its defaults, ranges and checks (`python -m tfdist.train --help`
            says what each means): every field of `tfdist.strategies.StrategyOptions`
            (`devices`: local replicas, GPUs or the CPU split into this many;
            `collective`, `collective_timeout_s`, `startup_timeout_s`,
            `grad_compression`, `bucket_mb`, `shard` ("optimizer", "gradients",
            "parameters": `tfdist.zero`),
            `microbatches`, `schedule` (with "auto": pass `global_batch_size` to
            `model()`), `virtual_stages`, `balance`, `placement`, `stages`, `tensor_parallel`, `ps_shards`,
            `min_shard_bytes`), and `threads`, `inter_op_threads`, `tf_logs` (show
            TensorFlow's C++ start-up lines): `tfdist.config.SCRIPT_OPTIONS`.
            None leaves an option at its default.

    Returns:
        A `Distributed`.

    Raises:
        ConfigError: for an unknown strategy or option, a value out of range, an
            option the strategy does not use, or a missing optional dependency.
        ClusterError: for an inconsistent cluster environment.
    """
    from tfdist import cluster as cluster_lib
    from tfdist import config, strategies
    from tfdist.compat.tf_startup_logs import import_tensorflow

    cfg = config.for_script(strategy, options)  # every check the command line makes
    settings = cfg.typed
    strategies.check_available(strategy)
    info = cluster_lib.detect()
    devices = settings.adapter.devices
    choice = strategies.choose(strategy, info, devices)
    config.check_strategy(cfg, strategy, choice.names)
    # Before TensorFlow: e.g. a one-process strategy started as one task of several.
    choice.check_cluster()
    runtime = settings.runtime
    import_tensorflow(show_logs=settings.logs.tf_logs or cluster_lib.detect_console().tf_logs)
    from tfdist.strategies.devices import configure_runtime, cpu_split, gpu_count

    configure_runtime(cpu_devices=cpu_split(devices), intra_op_threads=runtime.threads or None,
                      inter_op_threads=runtime.inter_op_threads or None)
    adapter_class = choice.resolve(gpu_count())
    if not adapter_class.runs_loop(info):  # a stage task, a ps server: serves, never returns
        adapter_class(info, settings.adapter).serve(runtime.threads)
    return build(strategy, info, settings.adapter, gpu_count())


def build(strategy: str, cluster, options, gpus: int, say=None) -> Distributed:
    """The `Distributed` of `strategy` on `cluster`: the one set-up path of `setup()`
    and of the CLI's run (`tfdist.run.trainer`), after the runtime is configured.

    Args:
        strategy: As asked ("auto" or a name); resolved here with `gpus`.
        cluster: This process's ClusterInfo.
        options: `tfdist.strategies.StrategyOptions`.
        gpus: Physical GPUs TensorFlow counted.
        say: Called with the adapter's start-up note (e.g. waiting for peers).
    """
    from tfdist import strategies

    adapter, built = strategies.build(strategy, cluster, options, gpus, say=say)
    return Distributed(strategy=built, name=adapter.name, cluster=cluster, hooks=adapter.hooks())
