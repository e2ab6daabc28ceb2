"""The coordinator (chief) of a parameter-server job: Keras 3 models, custom steps.

Keras 3 `fit` cannot drive ParameterServerStrategy (keras-team/keras#18624),
so this module is the training loop. It builds the recipe's model, optimizer
and loss under the strategy's scope (variables go to the ps tasks), gives
every worker its own shard of the data (`create_per_worker_dataset`), and
schedules steps with `ClusterCoordinator.schedule`: each step runs on
whichever worker is free, reads the current weights from the ps, and applies
its gradients there without waiting for the others (asynchronous SGD).

The strategy comes from `tfdist.distributed.build`, as the fit loop's and an
own script's do; the adapter that declares this loop (`Adapter.loop`) also
says which tasks run it (`runs_loop`) and what the others do (`serve`).

Failures: ClusterCoordinator re-queues a step whose worker died and runs it on
another worker; the job goes on without the dead one (a worker whose host
vanished without a TCP reset is noticed by gRPC keepalive pings, which the
adapter's build turns on: `tfdist.compat.grpc_keepalive`). A lost ps holds part of
the model, so it ends the job here with a ClusterError; the chief backs up the
variables (read from the ps) at every epoch end through the shared
`BackupStore`, and a rerun resumes from the newest backup (weights and
optimizer state; asynchronous SGD is not deterministic, so unlike the
synchronous strategies the resumed run is not bitwise the same math).
"""

from __future__ import annotations

import re
import time

from tfdist import callbacks, data
from tfdist import recipe as recipe_lib
from tfdist.checkpoint import BackupStore, TrainState
from tfdist.errors import ClusterError
from tfdist.run import loop, run_dir
from tfdist.ps.net import reachable
from tfdist.run.types import Result, check_free_space


def _log(message: str) -> None:
    print(f"tfdist: {message}", flush=True)  # the coordinator is the chief


def _lost_ps_error(error, spec) -> ClusterError:
    tasks = sorted({int(t) for t in re.findall(r"/job:ps/replica:0/task:(\d+)", str(error))})
    named = ", ".join(f"ps {t} ({spec['ps'][t]})" for t in tasks if t < len(spec["ps"]))
    return ClusterError(
        f"Lost parameter server {named or '(unknown task)'}: the model's variables live on "
        f"the ps tasks {spec['ps']}, so training cannot continue. TensorFlow said: "
        f"{type(error).__name__}: {str(error).splitlines()[0][:300]}\n"
        "HINT: restart the whole job (ps tasks keep no state across restarts); keep ps "
        "tasks on reliable machines.")


def _is_ps_error(error) -> bool:
    return "/job:ps" in str(error) or type(error).__name__ == "PSUnavailableError"


class CoordinatorRun:
    """One parameter-server run on the chief, in the order TensorFlow needs: `set_up`
    (runtime, strategy, data size), `build` (model, optimizer, every variable on the ps
    tasks), `resume`, `train_epochs` (steps scheduled on the workers), `finish`.

    `cfg` goes to the recipe's functions and the backup's record; everything else
    reads `settings`. The run pipeline has checked the cluster and the options
    (the adapter's `check_config`).
    """

    def __init__(self, run: loop.Run):
        from tfdist import instruments

        self.recipe, self.cfg, self.cluster = run.recipe, run.cfg, run.cluster
        self.writer, self.settings = run.writer, run.settings
        self.opts = run.settings.instruments
        self.extra = instruments.active(self.opts)  # e.g. the benchmarks' slow worker
        self.spec = run.cluster.tf_config["cluster"]
        self.workers = self.spec["worker"]

    def train(self) -> Result:
        """Every step; returns the Result (the chief also writes the model dir)."""
        self.set_up()
        self.build()
        self.resume()
        self.train_epochs()
        result = self.finish()
        self.tell_finished()
        return result

    def tell_finished(self) -> None:
        """Tells the worker and ps tasks the run finished, so that they end quietly
        (`tfdist.ps.server.tell_finished`; without it each says the chief has gone)."""
        from tfdist.ps import server

        server.tell_finished(self.spec["chief"][0], [
            (f"/job:{job}/replica:0/task:{i}/device:CPU:0", address)
            for job in ("worker", "ps") for i, address in enumerate(self.spec.get(job, []))])

    def set_up(self) -> None:
        """The runtime (before any op), the strategy and its coordinator, the learning
        rate and the steps per epoch; logs the run line."""
        import tensorflow as tf

        from tfdist import distributed
        from tfdist.strategies.devices import gpu_count

        settings, cluster = self.settings, self.cluster
        training, optim_ = settings.training, settings.optimization
        loop.set_up(settings)  # as the fit loop; float16 losses are scaled in the step
        # The set-up the fit loop and an own script's tfdist.setup() get: the adapter
        # resolved, its strategy built (with the adapter's upstream fixes applied first).
        self.dist = distributed.build(settings.strategy, cluster, settings.adapter,
                                      gpu_count(), say=_log)
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(self.dist.strategy)
        self.gbs = gbs = training.global_batch_size
        self.lr = data.scale_learning_rate(optim_.learning_rate, gbs,
                                           optim_.base_batch_size or gbs, optim_.lr_scaling)
        self.train_unbatched = data.as_source(
            recipe_lib.build_dataset(self.recipe, self.cfg, "train")).dataset
        num_examples = data.count_elements(self.train_unbatched)
        self.steps_per_epoch = training.steps_per_epoch or max(1, num_examples // gbs)
        _log(loop.run_line({
            "recipe": self.recipe.RECIPE_NAME, "strategy": self.dist.name,
            "workers": len(self.workers), "ps": len(self.spec["ps"]), "batch_per_step": gbs,
            "steps_per_epoch": self.steps_per_epoch, "learning_rate": self.lr,
            "precision": optim_.precision, "ps_shards": settings.adapter.ps_shards,
            **{k: v for i in self.extra for k, v in i.line_fields(self.opts).items()}}))

    def build(self) -> None:
        """The model and optimizer under the strategy, every variable created on the ps."""
        import keras

        recipe, cfg = self.recipe, self.cfg
        self.compile_kwargs = recipe_lib.compile_kwargs(recipe, cfg)
        with self.dist.scope():
            model = recipe_lib.build_model(recipe, cfg)
            optimizer = recipe_lib.build_optimizer(recipe, cfg, self.lr,
                                                   self.settings.optimization)
            model.compile(optimizer=optimizer, loss=self.compile_kwargs.get("loss"))
            # Every variable (weights, optimizer slots, loss state) is created here,
            # eagerly: scheduled functions run on workers and may not create variables.
            x0, y0, w0 = keras.utils.unpack_x_y_sample_weight(
                next(iter(self.train_unbatched.batch(2))))
            model.compute_loss(x=x0, y=y0, y_pred=model(x0, training=False), sample_weight=w0,
                               training=False)
            optimizer.build(model.trainable_variables)
        self.model, self.optimizer = model, optimizer
        check_free_space(self.writer.model_dir, self.cluster, model, optimizer)

    def resume(self) -> None:
        """The newest backup's weights and optimizer state, assigned on the ps tasks."""
        training, backup_s = self.settings.training, self.settings.backup
        self.store = store = BackupStore(self.writer, keep=backup_s.keep)
        self.meta = {"recipe": self.recipe.RECIPE_NAME, "num_replicas": len(self.workers),
                     "global_batch_size": self.gbs, "config": run_dir.run_config(self.cfg),
                     "epochs": training.epochs}  # for reruns
        # Assignments inside the scope go to the ps tasks.
        restored, latest = store.resume(backup_s.resume, self.meta, self.model.variables,
                                        self.optimizer.variables, self.dist.scope)
        self.state = restored or TrainState(history={"loss": []})
        if restored:
            _log(f"resumed from {latest}: epoch {self.state.epoch} (global step "
                 f"{self.state.global_step})")
        elif latest:
            _log(f"--no-resume: removed old backups in {store.directory}")

    def _per_worker_iterator(self):
        """Each worker's own shard of the training data, repeated and batched."""
        import tensorflow as tf

        recipe, cfg, strategy = self.recipe, self.cfg, self.dist.strategy
        training, gbs, num_workers = self.settings.training, self.gbs, len(self.workers)
        shuffle_buffer, seed = training.shuffle_buffer, training.seed

        def dataset_fn(_input_context):
            ds = data.as_source(recipe_lib.build_dataset(recipe, cfg, "train")).dataset
            # Disjoint shards: without this every worker would read the same examples.
            index = tf.distribute.coordinator.experimental_get_current_worker_index()
            ds = ds.shard(num_workers, index)
            if shuffle_buffer > 0:
                ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
            return ds.repeat().batch(gbs, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

        @tf.function
        def per_worker_dataset_fn():
            return strategy.distribute_datasets_from_function(dataset_fn)

        return iter(self.coordinator.create_per_worker_dataset(per_worker_dataset_fn))

    def _step(self):
        """The step each worker runs: its batch, its gradients applied on the ps at once."""
        import keras
        import tensorflow as tf

        model, strategy, extra, opts = self.model, self.dist.strategy, self.extra, self.opts

        @tf.function
        def step(iterator):
            index = tf.distribute.coordinator.experimental_get_current_worker_index()
            deps = [op for i in extra for op in i.step_deps(opts, index)]

            def replica_fn(batch):
                # (x, y) or (x, y, sample_weight), as Keras fit takes them (a recipe may
                # weight its examples, e.g. numbers_to_words masks its padding).
                x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
                with tf.GradientTape() as tape:
                    y_pred = model(x, training=True)
                    loss = model.compute_loss(x=x, y=y, y_pred=y_pred,
                                              sample_weight=sample_weight, training=True)
                    # Scaled under mixed_float16 (a LossScaleOptimizer), which apply() unscales.
                    scaled = model.optimizer.scale_loss(loss)
                grads = tape.gradient(scaled, model.trainable_variables)
                model.optimizer.apply(grads, model.trainable_variables)
                return loss

            with tf.control_dependencies(deps):  # a straggler sleeps first, as a slow machine
                batch = next(iterator)
            loss = strategy.run(replica_fn, args=(batch,))
            return strategy.reduce(tf.distribute.ReduceOp.MEAN, loss, axis=None), index

        return step

    def train_epochs(self) -> None:
        """Each epoch's steps scheduled on whichever worker is free, then a backup; a lost
        worker is noted and its steps re-run elsewhere, a lost ps ends the job (named)."""
        import tensorflow as tf

        settings, coordinator, state = self.settings, self.coordinator, self.state
        epochs, workers, writer = settings.training.epochs, self.workers, self.writer
        iterator, step = self._per_worker_iterator(), self._step()
        # Keras's TensorBoard callback, driven by this loop as fit drives it (chief only).
        tensorboard = callbacks.make_tensorboard(writer) if settings.logs.tensorboard else None
        if tensorboard is not None:
            tensorboard.set_model(self.model)
            tensorboard.on_train_begin()
        # The same chief-only history.csv the fit loop writes, rewritten each epoch.
        csv_log = callbacks.make_csv_logger(writer, state) if settings.logs.csv_log else None
        history = state.history
        self.steps_per_worker = [0] * len(workers)
        self.lost: dict[int, int] = {}  # worker index -> epoch it was first found unreachable
        ticker = self._ticker()
        start = time.perf_counter()
        try:
            for epoch in range(state.epoch, epochs):
                results = [coordinator.schedule(step, args=(iterator,))
                           for _ in range(self.steps_per_epoch)]
                if ticker is not None:
                    ticker.begin_epoch(epoch)
                    self._fetch_with_progress(results, ticker)
                coordinator.join()
                fetched = coordinator.fetch(results)
                losses = [float(loss) for loss, _ in fetched]
                for _, index in fetched:
                    self.steps_per_worker[int(index)] += 1
                history["loss"].append(sum(losses) / len(losses))
                self._note_lost_workers(epoch)
                _log(f"epoch {epoch + 1}/{epochs} loss={history['loss'][-1]:.4f} "
                     f"steps_per_worker={self.steps_per_worker} lost_workers={sorted(self.lost)}")
                state.epoch = epoch + 1
                state.global_step = state.global_step + self.steps_per_epoch
                if tensorboard is not None:
                    tensorboard.on_epoch_end(epoch, {"loss": history["loss"][-1]})
                if csv_log is not None:
                    csv_log.on_epoch_end(epoch, {"loss": history["loss"][-1]})
                self.store.save(state, self.model.variables, self.optimizer.variables,
                                self.meta)
        except (tf.errors.OpError, ClusterError) as e:
            if _is_ps_error(e):
                raise _lost_ps_error(e, self.spec) from None
            raise
        finally:
            if tensorboard is not None:
                tensorboard.on_train_end()  # closes its event files
        self.wall = time.perf_counter() - start

    def _ticker(self):
        """The progress lines' `tfdist.progress.Ticker` (None with --verbose 0 or
        TFDIST_PROGRESS_S=0): this loop has no Keras bar, so a terminal gets them too."""
        from tfdist import config, progress
        from tfdist.cluster import detect_console

        console = detect_console()
        if not config.keras_verbosity(self.settings.logs.verbose, console.interactive):
            return None
        if not console.progress_s:
            return None
        return progress.Ticker(self.settings.training.epochs, self.steps_per_epoch, self.gbs,
                               console.progress_s)

    def _fetch_with_progress(self, results, ticker) -> None:
        """Waits for the scheduled steps in order, a progress line every interval.

        A step that failed raises its error from `coordinator.join()`, which the
        caller runs next (a fetch may see only its cancellation): so any error here
        is left to it.
        """
        import tensorflow as tf

        losses = []
        try:
            for k, result in enumerate(results):
                losses.append(float(result.fetch()[0]))
                ticker.step(k + 1, lambda: sum(losses) / len(losses))
        except tf.errors.OpError:
            pass

    def _note_lost_workers(self, epoch: int) -> None:
        """Logs each worker first found unreachable in `epoch` (training goes on)."""
        for i, address in enumerate(self.workers):
            if i not in self.lost and not reachable(address):
                self.lost[i] = epoch
                _log(f"worker {i} at {address} is unreachable; the coordinator re-runs "
                     "its steps on the other workers and training goes on")

    def finish(self) -> Result:
        """The trained weights gathered from the ps into an ordinary Keras model, which
        evaluates on the chief and saves as a model any strategy can load; metrics.json."""
        recipe, cfg, workers, state, wall = (self.recipe, self.cfg, self.workers, self.state,
                                             self.wall)
        training, optim_ = self.settings.training, self.settings.optimization
        local = recipe_lib.build_model(recipe, cfg)
        local.set_weights([w.numpy() if hasattr(w, "numpy") else w
                           for w in self.model.get_weights()])
        local.compile(**self.compile_kwargs)
        test_ds = data.prepare(recipe_lib.build_dataset(recipe, cfg, "test"), self.gbs,
                               training=False)
        total_steps = sum(self.steps_per_worker)  # this run's steps (a resumed run did fewer)
        metrics = {
            "recipe": recipe.RECIPE_NAME,
            "strategy": self.dist.name,
            "num_workers": len(workers),
            "num_ps": len(self.spec["ps"]),
            "ps_shards": self.settings.adapter.ps_shards,
            "precision": optim_.precision,
            "global_batch_size": self.gbs,
            "learning_rate": self.lr,
            "epochs": training.epochs,
            "steps": total_steps,
            "global_step": state.global_step,
            "steps_per_worker": self.steps_per_worker,
            "lost_workers": [{"worker": i, "address": workers[i], "found_in_epoch": e + 1}
                             for i, e in sorted(self.lost.items())],
            **{k: v for i in self.extra for k, v in i.describe(self.opts).items()},
            "history": state.history,
            "wall_time_s": wall,
            "examples_per_s": total_steps * self.gbs / wall if wall > 0 else 0.0,
        }
        if self.lost:
            _log(f"finished without lost worker(s) {sorted(self.lost)}: "
                 + ", ".join(f"worker {i} ({workers[i]})" for i in sorted(self.lost)))
        metrics = loop.finish(local, test_ds, metrics, self.writer, self.cluster, recipe, cfg,
                              self.settings.backup.final_weights)
        return Result(model=local, metrics=metrics, strategy=self.dist.strategy,
                      cluster=self.cluster)


class CoordinatorLoop(loop.Loop):
    """The chief schedules steps on workers (`CoordinatorRun`); the tasks that do not
    run the loop (the adapter's `runs_loop`) serve (the adapter's `serve`).

    The run pipeline has checked the cluster and the options (the adapter's
    `check_config`).
    """

    kind = "coordinator"

    def run(self, run: loop.Run):
        """Runs this process's part of the job.

        Returns:
            A `tfdist.run.types.Result` on the chief; the other tasks serve until their
            chief has gone.
        """
        from tfdist import instruments

        adapter = run.choice.candidates[0]
        recipe_lib.check_hooks_for_own_loop(run.recipe, adapter.name)
        opts = run.settings.instruments
        for instrument in instruments.active(opts):  # counted among the job's workers
            instrument.check(opts, run.cluster.training_workers)
        if not adapter.runs_loop(run.cluster):
            return loop.serve(run)
        loop.start_tensorflow(run.settings)
        return CoordinatorRun(run).train()
