"""`pipeline`: model-parallel stages fed with micro-batches (GPipe or 1F1B schedule).

Like `model_parallel`, with each batch split into `--microbatches M` equal
micro-batches that flow through the stages so that devices overlap; gradients
are summed over the micro-batches and applied once per batch. The idle
fraction of each step is about (p - 1) / (M + p - 1) for p balanced stages;
`python -m tfdist.bench pipeline` measures it.

In one process the stages are logical devices (`--devices`). Started as
several tasks (`tfdist.launch -n P`, TF_CONFIG, Slurm), each task holds one
stage, its weights and optimizer state (`tfdist.model_parallel.stage_tasks`): the
chief drives the run and holds stage 0, the other tasks serve theirs.
"""

from __future__ import annotations

from tfdist.strategies import model_parallel, register


def build(cluster, options):
    """The default strategy (one replica); see `model_parallel.build`."""
    return model_parallel.build(cluster, options)


def transform_model(model, options, devices=None, copies=1, global_batch_size=0):
    """Splits `model` into stages trained with `options.microbatches` micro-batches.

    Under `--schedule auto` or `--balance time` the planner measures the
    model's layers first (`model_parallel.planning.auto`), prints its predictions, and
    picks the schedule or moves the cuts.

    Args:
        model: The recipe's built model.
        options: StrategyOptions.
        devices: The stages' devices (tasks across processes); None: local devices.
        copies: Data-parallel copies of the pipeline over `devices` (copy-major).
        global_batch_size: Examples a step, all copies (the planner's micro-batch).

    Raises:
        ConfigError: when the planner is asked for without a batch size.
    """
    import dataclasses

    from tfdist.model_parallel.planning import auto, simulate

    node_costs = None
    if auto.needed(options):
        from tfdist.errors import ConfigError
        from tfdist.strategies.devices import local_devices

        if not global_batch_size:
            raise ConfigError("--schedule auto and --balance time size the planner's "
                              "micro-batch from the batch: pass global_batch_size to "
                              "tfdist's model() (python -m tfdist.train does).")
        across = devices is not None  # only the stage tasks' hooks name the devices
        devices = devices if across else local_devices(options.devices)
        stages = len(devices) // (copies * options.tensor_parallel)
        planned = auto.plan(model, options, stages,
                            global_batch_size // (copies * options.microbatches), copies,
                            across_processes=across)
        for line in planned.lines:
            print(line, flush=True)
        node_costs = planned.node_costs
        options = dataclasses.replace(options, schedule=planned.schedule,
                                      virtual_stages=planned.virtual)
    split = model_parallel.transform_model(model, options, options.microbatches,
                                           options.schedule, devices=devices, copies=copies,
                                           node_costs=node_costs)
    v = options.virtual_stages
    p = len(split.stage_devices) // v
    data = f" x {copies} data-parallel copies" if copies > 1 else ""
    bubble = simulate.formula(options.schedule, p, options.microbatches, v)
    print(f"tfdist: pipeline p={p}{data} m={options.microbatches} schedule={options.schedule}"
          f"{f' v={v}' if v > 1 else ''} theoretical bubble {bubble:.3f}", flush=True)
    return split


def check_schedule(options, stages: int) -> None:
    """Pure check of --schedule, --virtual-stages, --balance and --microbatches against P.

    Raises:
        ConfigError: what `schedules.build` refuses (V without interleaved, M not a
            multiple of P under interleaved); --schedule auto or --balance time
            with --placement (the planner cuts the model; --placement names cuts).
    """
    from tfdist.errors import ConfigError
    from tfdist.model_parallel import schedules

    asked = [f for f, on in (("--schedule auto", options.schedule == "auto"),
                             ("--balance time", options.balance == "time")) if on]
    if asked and options.placement:
        raise ConfigError(f"{' and '.join(asked)} {'let' if len(asked) > 1 else 'lets'} the "
                          "planner cut the model; --placement "
                          "names the cuts itself. Drop one of them.")
    if options.schedule == "auto":  # V is the one interleaving is offered with
        return
    schedules.build(options.schedule, max(stages, 1), options.microbatches,
                    options.virtual_stages)


def check_one_process(options) -> None:
    """Pure check: a pipeline in one process has stages on at least two devices.

    Raises:
        ConfigError: for --stages (stages in processes of their own), or fewer
            than two --devices without --placement (one stage: no pipeline).
    """
    from tfdist.errors import ConfigError

    if options.stages:
        raise ConfigError(
            f"--stages {options.stages} places stages in processes of their own, but this "
            "is one process. Start the stages as tasks: python -m tfdist.launch -n "
            f"{options.stages} -- python -m tfdist.train RECIPE --strategy pipeline; in "
            "one process, split over logical devices with --devices P.")
    if options.devices < 2 and not options.placement:
        given = f"--devices {options.devices}" if options.devices else "no --devices"
        raise ConfigError(
            f"--strategy pipeline in one process cuts the model into stages over --devices P "
            f"logical devices, but this run has {given}: it would train one stage, without "
            "a pipeline. Pass --devices 2 (or more) or name the stages with --placement; or "
            "start one stage per process: python -m tfdist.launch -n 2 -- python -m "
            "tfdist.train RECIPE --strategy pipeline.")


class StageHooks(model_parallel.ModelParallelHooks):
    """Trainer hooks of the chief of a pipeline across processes."""

    placed_backups = True  # each stage task writes and reads its own variables

    def __init__(self, options, cluster):
        from tfdist.model_parallel import stage_tasks

        self.cluster = cluster
        devices = stage_tasks.stage_devices(cluster.num_tasks, options.stages,
                                            options.tensor_parallel)
        _, copies = stage_tasks.layout(cluster.num_tasks, options.stages)
        super().__init__(options, self._split)
        self.devices = devices
        self.copies = copies

    def _split(self, model, options, global_batch_size=0):
        """`transform_model` over the tasks; a model too small for the stages is refused
        with advice in processes and --stages (--devices does not apply here)."""
        from tfdist.errors import ConfigError
        from tfdist.model_parallel import graph
        from tfdist.model_parallel import stage_tasks

        try:
            return transform_model(model, options, self.devices, self.copies,
                                   global_batch_size)
        except graph.SplitError as e:
            raise ConfigError(stage_tasks.too_many_stages(self.cluster.num_tasks, e.stages,
                                                     e.most)) from None

    def num_replicas(self, strategy) -> int:
        """The data-parallel copies of the pipeline (each takes 1/C of every batch)."""
        return self.copies

    def layout(self) -> dict:
        """Stages and copies, for the run's first line."""
        return {"stages": self.cluster.num_tasks // self.copies, "copies": self.copies}

    def callbacks(self, learning_rate, warmup_epochs=0.0, global_batch_size=0):
        """The stage watchdog (a stopped stage ends the job, named); copies of the
        pipeline take copy 0's weights when training starts (a backup restores copy
        0's only)."""
        import keras

        from tfdist.model_parallel import stage_tasks

        out = [*super().callbacks(learning_rate, warmup_epochs, global_batch_size),
               stage_tasks.watchdog(self.cluster, self.options.collective_timeout_s,
                              stages=self.options.stages)]
        if self.copies > 1:
            class SyncCopies(keras.callbacks.Callback):
                def on_train_begin(self, logs=None):
                    self.model.sync_copies()

            out.append(SyncCopies())
        return out

    def build_model(self, build):
        """Without values: each stage's are computed on its task (`model_parallel.deferred`)."""
        from tfdist.model_parallel import deferred

        return deferred.build_without_values(build)

    def lost_peer(self, strategy, error):
        """The first stage task that no longer accepts connections (a TensorFlow error
        names no task): its port closes when its process dies."""
        from tfdist.model_parallel import stage_tasks

        return stage_tasks.lost_stage(self.cluster, stages=self.options.stages)


@register
class Pipeline(model_parallel.ModelParallel):
    """Model-parallel stages fed with micro-batches, in one process or one per task."""

    name = "pipeline"
    loop = "stages"
    accepts = ("devices", "placement", "microbatches", "schedule", "tensor_parallel", "stages",
               "collective_timeout_s", "virtual_stages", "balance")
    one_process = False  # one stage per task when started as several
    portable = True  # the same math as one device: a backup resumes at any P, or unsplit

    @classmethod
    def check_cluster(cls, cluster):
        if cluster.num_tasks > 1:
            from tfdist.model_parallel import stage_tasks

            stage_tasks.check_cluster(cluster)

    @classmethod
    def check_config(cls, settings, cluster):
        options = settings.adapter
        if cluster.num_tasks > 1:
            from tfdist.model_parallel import stage_tasks

            stage_tasks.check_options(cluster, options.stages, options.devices,
                                 options.tensor_parallel, options.placement)
            _, copies = stage_tasks.layout(cluster.num_tasks, options.stages)
            stage_tasks.check_batch(settings.training.global_batch_size, copies,
                               options.microbatches)
            check_schedule(options, stage_tasks.layout(cluster.num_tasks, options.stages)[0])
            # Not ModelParallel's: its --devices/--tensor-parallel rule is one process's.
            super(model_parallel.ModelParallel, cls).check_config(settings, cluster)
            return
        check_one_process(options)
        from tfdist.model_parallel import plan

        check_schedule(options, len(plan.parse_placement(options.placement))
                       if options.placement else
                       (options.devices or 0) // max(options.tensor_parallel, 1))
        super().check_config(settings, cluster)

    @classmethod
    def dir_layout(cls, settings, workers):
        """"-Pst[-Ccp]" across processes (`-n 4 --stages 2` and `-n 4` are two layouts of
        4 processes), "-Ddev" in one; "-Kmb" where micro-batches change the math: under
        float16 or bfloat16 each micro-batch's matmuls round apart (docs/equality.md).
        In float32 a run at another --microbatches is the same math (to float32
        rounding) and resumes there."""
        from tfdist.errors import ConfigError
        from tfdist.model_parallel import stage_tasks

        options = settings.adapter
        out = f"-{options.devices}dev" if options.devices else ""
        if workers > 1:  # --devices is 0 or P there: the stages say it
            try:
                p, copies = stage_tasks.layout(workers, options.stages)
            except ConfigError:  # refused by `check_config`, naming both numbers
                p, copies = workers, 1
            out = f"-{p}st" + (f"-{copies}cp" if copies > 1 else "")
        if options.microbatches > 1 and settings.optimization.precision != "float32":
            out += f"-{options.microbatches}mb"
        return out

    @classmethod
    def runs_loop(cls, cluster):
        return cluster.is_chief  # the other stage tasks serve

    @property
    def across_processes(self) -> bool:
        """One stage per task of the job."""
        return self.cluster is not None and self.cluster.num_tasks > 1

    def build(self):
        if not self.across_processes:
            return build(self.cluster, self.options)
        import tensorflow as tf

        from tfdist.model_parallel import stage_tasks

        stage_tasks.connect(self.cluster, self.options.startup_timeout_s,
                            self.options.tensor_parallel)
        return tf.distribute.get_strategy()

    def hooks(self):
        if not self.across_processes:
            return model_parallel.ModelParallelHooks(self.options, transform_model)
        return StageHooks(self.options, self.cluster)

    def finished(self):
        """The chief tells the stage tasks the run finished (`stage_tasks.tell_finished`)."""
        if self.across_processes:
            from tfdist.model_parallel import stage_tasks

            stage_tasks.tell_finished(self.cluster)

    def serve(self, threads: int = 0):
        """A stage task other than the chief: serves its stage until the chief ends
        (never returns)."""
        from tfdist.model_parallel import stage_tasks

        stage_tasks.serve(self.cluster, threads, self.options.startup_timeout_s,
                    self.options.stages, self.options.tensor_parallel)
