"""The training run: recipe + config + cluster -> trained model and metrics.

This is the library entry the CLI (`tfdist.train`) calls; it knows nothing of
argument parsing. Order matters: devices and threads are configured and the
strategy is built before any TensorFlow op runs, as TensorFlow requires.

Fault tolerance: the chief backs the run up (every epoch, and every
`save_every_steps`) to MODEL_DIR/backup; a rerun of the same command resumes
from the newest backup at the same data position, so an interrupted and
resumed run is the same math as an uninterrupted one. SIGTERM (and SIGINT,
Ctrl-C) saves a backup at the next agreed step boundary and raises
`Preempted`; a lost peer raises `PeerLostError` naming it.
"""

from __future__ import annotations

import importlib.util
import os
import time

from tfdist import cluster as cluster_lib
from tfdist import config, data, instruments, optim, strategies
from tfdist import recipe as recipe_lib
from tfdist.checkpoint import CORRUPT_SUFFIX, BackupStore, TrainState
from tfdist.writer import ChiefWriter
from tfdist.errors import ConfigError, PeerLostError
from tfdist.run import loop as loop_lib
from tfdist.run import run_dir
from tfdist.run.coordinator import CoordinatorLoop
from tfdist.settings import Settings
# The run types live apart so the parameter-server loop need not import this module.
from tfdist.run.types import Preempted, Result, check_free_space, model_dir_for  # noqa: F401


def check_before_tensorflow(settings: Settings, cluster, choice=None) -> None:
    """Validates what can be validated without starting TensorFlow.

    Args:
        settings: The run's options (`Settings.of(cfg)`).
        cluster: This process's ClusterInfo.
        choice: The `tfdist.strategies.Choice` for `settings.strategy`; made when None.

    Raises:
        ConfigError: for an unknown strategy, a batch that cannot divide, a
            bad scaling rule, or whatever an adapter refuses.
        ClusterError: for a cluster the adapter cannot run on.
    """
    choice = choice or strategies.choose(settings.strategy, cluster, settings.adapter.devices)
    choice.check_available()  # e.g. Horovod not installed
    if settings.logs.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("--tensorboard needs the tensorboard package, which TensorFlow no "
                          "longer installs: pip install 'tfdist[tensorboard]'.")
    optim_ = settings.optimization
    optim.check(optim_)
    config.keras_verbosity(settings.logs.verbose, interactive=False)
    effective = settings.training.global_batch_size * optim_.accumulate
    data.scale_learning_rate(optim_.learning_rate, effective,
                             optim_.base_batch_size or effective, optim_.lr_scaling)
    # Each adapter's own checks (availability, batch division, ports, hosts, placement),
    # for every adapter `auto` may become once TensorFlow counts the GPUs.
    choice.check_config(settings)
    for instrument in instruments.active(settings.instruments):  # e.g. the benchmarks' slow worker
        instrument.check(settings.instruments, cluster.training_workers)


def describe_peer_failure(lost, cluster, name_of=None) -> str | None:
    """'worker 1 (198.18.0.2:5001, host h1)': the lost peer, in words, if known.

    Args:
        lost: The engine's `PeerLostError` with the peer's rank (see
            `Hooks.lost_peer`), or None when the engine could not tell.
        cluster: This worker's ClusterInfo (its TF_CONFIG has the addresses).
        name_of: address -> host name or None (default `host_name`, a lookup in
            this host's resolver, e.g. /etc/hosts); pure when given.
    """
    return _describe(locate_peer(lost, cluster), name_of)


def _describe(found, name_of=None) -> str | None:
    """'worker 1 (ADDRESS, host h1)' for `locate_peer`'s (job, rank, address), or None."""
    if found is None:
        return None
    job, rank, address = found
    where = _where(address, name_of or host_name) if address else ""
    return f"{job} {rank}{where}"


def locate_peer(lost, cluster) -> tuple[str, int, str | None] | None:
    """Pure function: (job, rank, address) of the lost peer, from the engine's fields.

    The address comes from the cluster spec when the engine gave only a rank.
    A collective that timed out names nobody; with one peer it can only be that one.
    """
    if lost is not None and lost.rank is not None:
        addresses = ((cluster.tf_config or {}).get("cluster", {}).get(lost.job)
                     or (cluster.worker_addresses if lost.job == "worker" else []))
        address = lost.address or (addresses[lost.rank] if lost.rank < len(addresses) else None)
        return lost.job, lost.rank, address
    addresses = cluster.worker_addresses
    if cluster.num_workers == 2 and len(addresses) == 2 and cluster.worker_index in (0, 1):
        peer = 1 - cluster.worker_index
        return "worker", peer, addresses[peer]
    return None


def _where(address: str, name_of) -> str:
    host = address.rpartition(":")[0].strip("[]")
    name = name_of(host) if not host.startswith("127.") else None
    return f" ({address}, host {name})" if name and name != host else f" ({address})"


def host_name(address: str, timeout_s: float = 2.0) -> str | None:
    """The name `address` has in this host's resolver, or None; waits at most `timeout_s`.

    Only called once a peer is lost, to name its host next to its address;
    a slow DNS must not delay the exit, hence the thread.
    """
    import socket
    import threading

    found: list[str] = []

    def look():
        try:
            found.append(socket.gethostbyaddr(address)[0])
        except (OSError, UnicodeError):
            pass

    t = threading.Thread(target=look, daemon=True)
    t.start()
    t.join(timeout_s)
    return found[0] if found else None


def _counter():
    import keras

    class Counter(keras.callbacks.Callback):
        """Counts training steps, for examples/s."""

        steps = 0

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1

    return Counter()


_log = loop_lib.log


def train(recipe, cfg: dict, cluster=None, callbacks=None) -> Result:
    """Trains `recipe` as configured by `cfg` on the discovered cluster.

    Args:
        recipe: A loaded recipe module (see `tfdist.recipe`).
        cfg: The merged configuration (see `tfdist.config.merge`).
        cluster: ClusterInfo; discovered from the environment when None.
        callbacks: Extra Keras callbacks for `fit`, run on every worker.

    Returns:
        A Result. The chief also writes MODEL_DIR/model.keras,
        MODEL_DIR/metrics.json, MODEL_DIR/history.csv and MODEL_DIR/backup/;
        other workers write nothing there.

    Raises:
        Preempted: after SIGTERM or SIGINT, once the backup is saved.
        PeerLostError: when another worker died or became unreachable.
        CheckpointError: when the backup to resume from is corrupt or foreign.
        ModelDirBusyError: when another job holds the model dir.
        StorageError: when the model dir cannot be written (before training,
            or at a save: one line naming the path and errno).
    """
    cluster = cluster or cluster_lib.detect()
    settings = Settings.of(cfg)  # the typed view, read once; `cfg` goes to the recipe
    # `auto` is resolved once: here to the adapters it may become (checked now),
    # after TensorFlow counts the GPUs to the one of them that is built.
    choice = strategies.choose(settings.strategy, cluster, settings.adapter.devices)
    if choice.loop != "fit":
        # Only the fit loop acts on a caught signal (its workers agree on a step and
        # save); the parameter-server and stage loops keep the signals' own actions.
        from tfdist import preemption

        caught = preemption.current()
        if caught is not None:
            caught.uninstall(redeliver=True)  # one that came already acts now, as it would have
    config.check_strategy(cfg, settings.strategy, choice.names)
    model_dir = model_dir_for(cfg, recipe.RECIPE_NAME, cluster)
    check_before_tensorflow(settings, cluster, choice)  # every strategy, every task
    recipe_lib.check_loss(recipe)
    recipe_lib.check_config(recipe, cfg)
    runs_loop = all(c.runs_loop(cluster) for c in choice.candidates)  # ps servers just serve
    # A pipeline stage task also reads it (where it can see the model dir): its
    # chief would never connect to a finished run, and the stage would wait for it.
    if runs_loop or choice.loop == "stages":
        found = run_dir.inspect(model_dir, cfg, recipe.RECIPE_NAME)  # before TensorFlow, and before any write
        if found.finished:
            finished(recipe, cfg, cluster, model_dir, found, settings)
            return Result(model=None, metrics=_read_metrics(model_dir), strategy=None,
                          cluster=cluster)
        if found.unsaved_end:
            _log(cluster, f"{model_dir}: its {found.epochs_done} epochs are trained but its "
                          "final model was not written; resuming to evaluate it and write "
                          "the model (no step is trained)")
    if runs_loop:
        line = run_dir.epochs_change_line(found, settings.training.epochs, model_dir)
        if line:
            _log(cluster, line)
        check_batch_change(found, settings.training)
    else:
        found = run_dir.Found()
    # The run's one writer: every file in the model dir goes through it (chief only).
    writer = ChiefWriter(model_dir, cluster.is_chief)
    # The chief owns the model dir for the whole run: probed, locked, cleaned.
    with writer.claim(lambda m: _log(cluster, m)):
        run = loop_lib.Run(recipe, cfg, cluster, writer, choice, list(callbacks or []),
                           found, settings)
        return LOOPS[choice.loop].run(run)


def finished(recipe, cfg: dict, cluster, model_dir: str, found, settings) -> None:
    """A finished run's rerun: says so; the chief writes a --final-weights form the run
    lacks from its last backup (`tfdist.export`: one process, no training, the model
    dir locked), and says which memory or speed options had nothing to act on.

    The rerun rule is `tfdist.config.RERUN_FREE`'s.
    """
    form = run_dir.missing_form(model_dir, settings.backup.final_weights)
    idle = run_dir.idle_options(getattr(cfg, "given", ()))
    line = f"{model_dir} already finished ({found.epochs_done} epochs), "
    line += (f"nothing to train; writing the --final-weights {form} form it lacks." if form
             else "nothing to do.")
    if idle:
        line += (f" {' '.join(idle)} act{'s' if len(idle) == 1 else ''} only while a run "
                 "trains: not used.")
    if not form:
        line += (f" Pass --epochs N (N > {found.epochs_done}) to train it further, or "
                 "--no-resume to start over.")
    _log(cluster, line)
    if form and cluster.is_chief:
        write_final_form(recipe, cfg, model_dir, found.backup, form, cluster)


def write_final_form(recipe, cfg: dict, model_dir: str, backup: str, form: str,
                     cluster) -> list[str]:
    """Writes a finished run's final weights in `form` from `backup` (its last, which
    holds the final model's weights) and removes the other form's files, the model
    dir claimed (one writer at a time). Returns the file names written."""
    from tfdist import export, final_weights as fw

    writer = ChiefWriter(model_dir, True)
    with writer.claim(lambda m: _log(cluster, m)):
        names = export.export([backup], model_dir, form, recipe, cfg, log=lambda m: None)
        for name in ([fw.KERAS] if form == "sharded" else fw.sharded_files(model_dir)):
            writer.remove(name)
    _log(cluster, f"--final-weights {form}: wrote the finished run's final weights as "
                  f"{', '.join(names)} in {model_dir} from its last backup {backup}; the other "
                  "form's files removed")
    return names


def build_unbuilt(model, element_spec) -> bool:
    """Calls a model that has no variables yet (a subclassed one) on one batch of zeros
    shaped as the dataset's x, so that it makes them; returns whether it did."""
    if model.weights:
        return False
    import tensorflow as tf

    def zeros(spec):
        return tf.zeros([1 if d is None else d for d in spec.shape], spec.dtype)

    model(tf.nest.map_structure(zeros, element_spec[0]), training=False)
    return True


def check_batch_change(found, training) -> None:
    """Refuses a batch change whose data position cannot be mapped (before TensorFlow).

    A mid-epoch position maps onto another batch through the data's passes
    (`checkpoint.rebatch`), which are the epochs only when --steps-per-epoch
    is 0.

    Args:
        found: What the model dir holds (`run_dir.inspect`).
        training: The run's `tfdist.settings.Training`.

    Raises:
        ConfigError: naming the backup's position and both batches.
    """
    changed = found.global_batch_size not in (None, training.global_batch_size)
    if changed and training.steps_per_epoch and found.step_in_epoch:
        raise ConfigError(
            f"{found.backup} was taken at step {found.step_in_epoch} of an epoch at global "
            f"batch {found.global_batch_size}; with --steps-per-epoch "
            f"{training.steps_per_epoch} an epoch is not a pass over the data, so that position "
            f"has no place in an epoch at global batch {training.global_batch_size}. Finish "
            f"the epoch at --global-batch-size {found.global_batch_size} first, or pass "
            "--steps-per-epoch 0.")


def _read_metrics(model_dir: str) -> dict:
    import json

    try:
        with open(os.path.join(model_dir, "metrics.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _examples(recipe, cfg):
    """Examples in one pass of the training data, when TensorFlow knows (else None)."""
    n = int(data.as_source(recipe_lib.build_dataset(recipe, cfg, "train")).dataset.cardinality())
    return n if n >= 0 else None


def _rebatch(state, old_gbs, gbs, fixed_steps, steps_per_epoch, train_dataset, cluster,
             lr_line):
    """The backup's position at this run's batch (see `checkpoint.rebatch`), logged."""
    from tfdist.checkpoint import rebatch

    old_per_pass = data.count_elements(train_dataset(repeat=False, batch=old_gbs))
    new_per_pass = (steps_per_epoch if not fixed_steps
                    else data.count_elements(train_dataset(repeat=False)))
    new, skipped = rebatch(state, old_gbs, gbs, old_per_pass, new_per_pass)
    seen = (state.data_position % old_per_pass) * old_gbs
    _log(cluster, f"{lr_line} Data position kept in examples: {seen} examples of the current "
                  f"pass done at batch {old_gbs} (step {state.step_in_epoch} of epoch "
                  f"{state.epoch}); going on at step {new.step_in_epoch} of epoch {new.epoch} "
                  f"at batch {gbs}, skipping {skipped} example(s) of this pass so that none "
                  "is trained twice in it")
    return new


def _set_learning_rate(optimizer, lr: float) -> None:
    """Assigns a constant learning rate (a schedule is rebuilt from it already)."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # LossScaleOptimizer
    variable = getattr(inner, "_learning_rate", None)
    if hasattr(variable, "assign"):
        variable.assign(lr)


class FitLoop(loop_lib.Loop):
    """Keras `fit` on every training process (synchronous strategies)."""

    kind = "fit"

    def run(self, run: loop_lib.Run) -> Result:
        return FitRun(run).train()


class StageLoop(loop_lib.Loop):
    """A model cut into stages, maybe one per task: the process that `runs_loop` runs
    `FitLoop` (driving every stage), the other tasks serve theirs (`Adapter.serve`)."""

    kind = "stages"

    def run(self, run: loop_lib.Run) -> Result:
        if run.choice.candidates[0].runs_loop(run.cluster):
            result = FitLoop().run(run)
            # The tasks that serve end quietly, told that the run finished.
            run.choice.candidates[0](run.cluster, run.settings.adapter).finished()
            return result
        return loop_lib.serve(run)


# The loop each adapter's `loop` kind names.
LOOPS: dict[str, loop_lib.Loop] = {
    loop.kind: loop for loop in (FitLoop(), CoordinatorLoop(), StageLoop())}


class FitRun:
    """One `fit` run on this process, in the order TensorFlow needs: `set_up` (runtime,
    strategy), `build` (data, model, optimizer), `resume`, `fit`, `finish`.

    `cfg` goes to the recipe's functions and the backup's record; everything
    else reads `settings`.
    """

    def __init__(self, run: loop_lib.Run):
        self.recipe, self.cfg, self.cluster = run.recipe, run.cfg, run.cluster
        self.writer, self.found, self.settings = run.writer, run.found, run.settings
        self.extra_callbacks = list(run.callbacks or [])

    def train(self) -> Result:
        """Every step; returns the Result."""
        self.set_up()
        self.build()
        self.resume()
        self.fit()
        return self.finish()

    def set_up(self) -> None:
        """TensorFlow, the runtime (before any op), the strategy and the learning rate."""
        settings, cluster = self.settings, self.cluster
        self.console = loop_lib.start_tensorflow(settings)
        import tensorflow as tf

        from tfdist import distributed
        from tfdist.compat.tf_startup_logs import hide_float16_notice
        from tfdist.strategies.devices import cpu_split, gpu_count

        options, optim_ = settings.adapter, settings.optimization
        loop_lib.set_up(settings, cpu_devices=cpu_split(options.devices))
        # The set-up an own script's tfdist.setup() gets: adapter, strategy, hooks.
        self.dist = dist = distributed.build(
            settings.strategy, cluster, options, gpu_count(),
            say=lambda note: print(f"tfdist: {note}", flush=True))
        if optim_.precision == "mixed_float16":
            hide_float16_notice(tf, enabled=not (settings.logs.tf_logs or self.console.tf_logs))
        self.gbs = gbs = settings.training.global_batch_size
        per_replica = data.per_replica_batch_size(gbs, dist.num_replicas)
        # With accumulation one optimizer step sees `accumulate` global batches.
        self.effective = effective = gbs * optim_.accumulate
        lr = data.scale_learning_rate(optim_.learning_rate, effective,
                                      optim_.base_batch_size or effective, optim_.lr_scaling)
        # A resumed run goes on at its backup's rate (rescaled if the batch changed).
        self.lr, self.rescaled = (run_dir.resume_learning_rate(self.found, self.cfg, lr)
                                  if settings.backup.resume else (lr, None))
        _log(cluster, loop_lib.run_line({
            "recipe": self.recipe.RECIPE_NAME, "strategy": dist.name,
            "num_replicas": dist.num_replicas, **dist.hooks.layout(),
            "workers": cluster.num_workers,
            "source": cluster.source, "global_batch_size": gbs,
            "per_replica_batch_size": per_replica, "learning_rate": self.lr,
            "accumulate": optim_.accumulate, "precision": optim_.precision,
            "model_dir": self.writer.model_dir}))

    def train_dataset(self, skip_batches=0, repeat=True, batch=None):
        """This process's training input, from `skip_batches` on."""
        training = self.settings.training
        return data.prepare(recipe_lib.build_dataset(self.recipe, self.cfg, "train"),
                            batch or self.gbs, num_workers=self.cluster.num_workers,
                            training=True, shuffle_buffer=training.shuffle_buffer,
                            seed=training.seed, shard_by=self.dist.hooks.input_shard(),
                            repeat=repeat, skip_batches=skip_batches)

    def build(self) -> None:
        """The data's size and sharding, then the model and optimizer under the strategy."""
        recipe, cfg, cluster, hooks = self.recipe, self.cfg, self.cluster, self.dist.hooks
        self.test_ds = data.prepare(recipe_lib.build_dataset(recipe, cfg, "test"), self.gbs,
                                    num_workers=cluster.num_workers, training=False)
        one_pass = self.train_dataset(repeat=False)
        data.check_full_batch(one_pass, self.gbs, lambda: _examples(recipe, cfg))
        self.steps_per_epoch = (self.settings.training.steps_per_epoch
                                or data.count_elements(one_pass))
        policy = self.test_ds.options().experimental_distribute.auto_shard_policy.name
        if hooks.input_shard():  # the adapter's processes each read their own slice
            policy = "RANK"
        self.policy = policy
        _log(cluster, f"input sharding: "
                      f"{policy if policy == 'RANK' else 'AutoShardPolicy.' + policy}"
                      f"; {self.steps_per_epoch} steps per epoch")
        with self.dist.scope():
            model = hooks.transform_model(hooks.build_model(
                lambda: recipe_lib.build_model(recipe, cfg)), global_batch_size=self.gbs)
            optimizer = hooks.wrap_optimizer(recipe_lib.build_optimizer(
                recipe, cfg, self.lr, self.settings.optimization))
            model.compile(optimizer=optimizer, **recipe_lib.compile_kwargs(recipe, cfg),
                          **hooks.compile_kwargs())
            recipe_lib.install_train_step(recipe, model)
            optimizer = model.optimizer  # a LossScaleOptimizer under mixed_float16
            # A batched dataset or one of the wrong shape fails here, naming the recipe,
            # not in fit.
            recipe_lib.check_fits(recipe, model, self.test_ds.element_spec, batched=True)
            # A subclassed model makes its variables at its first call: make them now,
            # or the optimizer below is built for none and fit's first step fails
            # ("Unknown variable").
            build_unbuilt(model, self.test_ds.element_spec)
            hooks.split_model(model)  # --shard parameters: each worker keeps its rows
            # Keras builds optimizers lazily; build now so a backup can fill its slots.
            optimizer.build(model.trainable_variables)
        self.model, self.optimizer = model, optimizer
        check_free_space(self.writer.model_dir, cluster, model, optimizer)

    def resume(self) -> None:
        """The newest backup's weights, optimizer state and data position, if any."""
        cluster, dist, backup_s = self.cluster, self.dist, self.settings.backup
        name, replicas, gbs = dist.name, dist.num_replicas, self.gbs
        from tfdist.zero.backup import shard_of

        self.store = store = BackupStore(self.writer, keep=backup_s.keep,
                                         shard=shard_of(self.optimizer),
                                         placed=dist.hooks.placed_backups)
        # The strategy and replica count are recorded, not matched (see check_compatible).
        self.meta = {"recipe": self.recipe.RECIPE_NAME, "strategy": name,
                     "num_replicas": replicas, "global_batch_size": gbs,
                     "accumulate": self.settings.optimization.accumulate,
                     "steps_per_epoch": self.steps_per_epoch,
                     "config": run_dir.run_config(self.cfg),
                     "epochs": self.settings.training.epochs,  # for reruns
                     "learning_rate": self.lr}
        try:
            restored, backup = store.resume(
                backup_s.resume, self.meta, self.model.variables, self.optimizer.variables,
                dist.scope, batch_change_ok=backup_s.rescale_lr_on_batch_change)
        finally:  # said even when the backup fallen back to is then refused
            for bad, why in store.skipped:
                _log(cluster, f"skipped backup {bad}, moved aside to {bad}{CORRUPT_SUFFIX}: "
                              f"{why}")
        self.state, self.resumed_from = ((restored, backup) if restored
                                         else (TrainState(), None))
        state = self.state
        if restored:
            _log(cluster, f"resumed from {backup}: epoch {state.epoch}, step "
                          f"{state.step_in_epoch} of {self.steps_per_epoch} (global step "
                          f"{state.global_step})")
            was = (store.record.get("num_replicas"), store.record.get("strategy"))
            old_gbs = store.record.get("global_batch_size")
            if was != (replicas, name) and None not in was:
                # Only at the same global batch is it the same math; a batch change says so.
                same = (f", at the same global batch {gbs}: the same examples per step, the "
                        "same math") if old_gbs == gbs else ""
                _log(cluster, f"resumed from a {was[0]}-replica {was[1]} backup on {replicas} "
                              f"replica{'s' if replicas != 1 else ''} ({name}){same}")
            if old_gbs != gbs:
                self.state = _rebatch(state, old_gbs, gbs, self.settings.training.steps_per_epoch,
                                      self.steps_per_epoch, self.train_dataset, cluster,
                                      self.rescaled or f"learning rate {self.lr:g}")
                with dist.scope():  # the backup's rate was restored with its variables
                    _set_learning_rate(self.optimizer, self.lr)
        elif backup:
            _log(cluster, f"--no-resume: removed old backups in {store.directory}")

    def _callbacks(self, backup_cb, counter) -> list:
        settings, hooks, logs = self.settings, self.dist.hooks, self.settings.logs
        from tfdist import callbacks as cb

        # The adapter's callbacks first: Horovod broadcasts rank 0's (restored)
        # state before anything else runs, and averages metrics before they are recorded.
        out = [*hooks.callbacks(self.lr, settings.optimization.warmup_epochs, self.gbs), counter,
               *self.extra_callbacks, *recipe_lib.callbacks(self.recipe, self.cfg, self.writer),
               backup_cb]
        for instrument in instruments.active(settings.instruments):
            out += instrument.fit_callbacks(settings.instruments, self.cluster)
        if logs.csv_log:
            out.append(cb.make_csv_logger(self.writer, self.state))
        if logs.tensorboard:
            out += [c for c in [cb.make_tensorboard(self.writer)] if c]
        # Last, where Keras puts its own.
        # With verbose 2 (a pipe, a file) also a progress line every 30 s of an epoch.
        out.append(cb.make_progress_bar(settings.training.epochs, self.steps_per_epoch, self.gbs))
        return out

    def fit(self) -> None:
        """Keras `fit` to the last epoch; a lost peer or a signal ends it (saved, named)."""
        import tensorflow as tf

        from tfdist import callbacks as cb
        from tfdist import preemption
        from tfdist.preemption import PreemptionWatcher, default_check_steps

        cluster, hooks, strategy = self.cluster, self.dist.hooks, self.dist.strategy
        backup_s, epochs, state = self.settings.backup, self.settings.training.epochs, self.state
        store, steps_per_epoch = self.store, self.steps_per_epoch
        # `python -m tfdist.train` has caught the signals since it started (a signal
        # during start-up is acted on at the first agreed step): kept after fit, so
        # one during the final save is still seen (tfdist.train says so).
        watcher = preemption.current()
        own = watcher is None
        watcher = watcher or PreemptionWatcher()
        backup_cb = cb.make_backup_callback(
            store, state, self.meta, steps_per_epoch=steps_per_epoch,
            save_every_steps=backup_s.save_every_steps, watcher=watcher,
            agree=lambda flag: hooks.any_worker(strategy, flag),
            check_every=backup_s.preempt_check_steps or default_check_steps(cluster.num_workers))
        self.counter = _counter()
        callbacks = self._callbacks(backup_cb, self.counter)
        verbose = config.keras_verbosity(self.settings.logs.verbose, self.console.interactive)
        start = time.perf_counter()
        try:
            while state.epoch < epochs and not backup_cb.preempted:
                # A run resumed mid-epoch first finishes that epoch on its own.
                partial = state.step_in_epoch > 0
                self.model.fit(self.train_dataset(skip_batches=state.data_position),
                               initial_epoch=state.epoch,
                               epochs=state.epoch + 1 if partial else epochs,
                               steps_per_epoch=steps_per_epoch - state.step_in_epoch,
                               verbose=verbose if cluster.is_chief else 0,
                               callbacks=callbacks,
                               shuffle=False)  # shuffling is data.prepare's job
        except (tf.errors.OpError, PeerLostError) as e:
            if not cluster.is_multi_worker:
                raise
            lost = hooks.lost_peer(strategy, e)  # the engine's fields, never its message
            located = locate_peer(lost, cluster)  # once: named in the message and as fields
            peer = _describe(located)
            found = located or (None, None, None)
            raise PeerLostError(
                f"lost contact with {peer or 'a peer worker'} during training "
                f"({type(e).__name__}: {str(e).splitlines()[0][:300]}). The newest backup is "
                f"{store.latest() or 'none yet'}; rerun the same command to resume.",
                rank=found[1], address=found[2], job=found[0] or "worker") from None
        finally:
            if own:
                watcher.uninstall()
        self.wall = time.perf_counter() - start
        if backup_cb.preempted:
            # Every worker stopped at the agreed step, where the chief saved.
            path = backup_cb.last_path or store.path_for(state.global_step)
            if watcher.interrupted:
                raise Preempted(f"interrupted at step {state.global_step}; backup {path}; "
                                "rerun to continue", path, interrupted=True)
            raise Preempted(f"preempted by signal {watcher.signum} at global step "
                            f"{state.global_step}; backup {path}. "
                            "Rerun the same command to continue.", path)

    def finish(self) -> Result:
        """Evaluation, then the chief's model and metrics.json."""
        optim_, dist, wall = self.settings.optimization, self.dist, self.wall
        metrics = {
            "recipe": self.recipe.RECIPE_NAME,
            "strategy": dist.name,
            "num_replicas": dist.num_replicas,
            "num_workers": self.cluster.num_workers,
            "global_batch_size": self.gbs,
            "learning_rate": self.lr,
            "optimizer": optim_.optimizer,
            "accumulate": optim_.accumulate,
            "effective_batch_size": self.effective,
            "clipnorm": optim_.clipnorm,
            "precision": optim_.precision,
            "loss_scaling": type(self.optimizer).__name__ == "LossScaleOptimizer",
            "shard_policy": self.policy,
            "epochs": self.settings.training.epochs,
            "steps_per_epoch": self.steps_per_epoch,
            "global_step": self.state.global_step,
            "resumed_from": self.resumed_from,
            "history": self.state.history,
            "wall_time_s": wall,
            "examples_per_s": self.counter.steps * self.gbs / wall if wall > 0 else 0.0,
        }
        metrics = loop_lib.finish(self.model, self.test_ds, metrics, self.writer, self.cluster,
                                  self.recipe, self.cfg, self.settings.backup.final_weights)
        return Result(model=self.model, metrics=metrics, strategy=dist.strategy,
                      cluster=self.cluster)
