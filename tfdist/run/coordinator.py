"""The coordinator (chief) of a parameter-server job: Keras 3 models, custom steps.

Keras 3 `fit` cannot drive ParameterServerStrategy (keras-team/keras#18624),
so this module is the training loop. It builds the recipe's model, optimizer
and loss under the strategy's scope (variables go to the ps tasks), gives
every worker its own shard of the data (`create_per_worker_dataset`), and
schedules steps with `ClusterCoordinator.schedule`: each step runs on
whichever worker is free, reads the current weights from the ps, and applies
its gradients there without waiting for the others (asynchronous SGD).

Failures: ClusterCoordinator re-queues a step whose worker died and runs it on
another worker; the job goes on without the dead one (a worker whose host
vanished without a TCP reset is noticed by gRPC keepalive pings,
`tfdist.compat.grpc_keepalive`). A lost ps holds part of
the model, so it ends the job here with a ClusterError; the chief backs up the
variables (read from the ps) at every epoch end through the shared
`BackupStore`, and a rerun resumes from the newest backup (weights and
optimizer state; asynchronous SGD is not deterministic, so unlike the
synchronous strategies the resumed run is not bitwise the same math).
"""

from __future__ import annotations

import re
import time

from tfdist import callbacks, data, strategies
from tfdist import recipe as recipe_lib
from tfdist.checkpoint import BackupStore, TrainState
from tfdist.writer import ChiefWriter
from tfdist.compat import grpc_keepalive
from tfdist.errors import ClusterError
from tfdist.run import loop, run_dir
from tfdist.ps.net import reachable
from tfdist.run.types import Result, check_free_space, model_dir_for


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


def train(recipe, cfg: dict, cluster, writer=None, settings=None):
    """Trains `recipe` asynchronously from the chief of a PS cluster.

    Args:
        recipe: A loaded recipe (build_model, build_dataset, compile_kwargs).
        cfg: The merged configuration.
        cluster: ClusterInfo of the chief.
        writer: The run's ChiefWriter (default: one for `model_dir_for(cfg, ...)`).
        settings: `cfg` as typed sections (read from `cfg` when None); `cfg`
            itself goes to the recipe's functions and the backup's record.

    Returns:
        A `tfdist.run.types.Result`; the chief also writes MODEL_DIR/model.keras
        and MODEL_DIR/metrics.json.

    Raises:
        ClusterError: when a parameter server is lost.
    """
    import keras
    import tensorflow as tf

    from tfdist import instruments

    from tfdist.settings import Settings

    settings = settings or Settings.of(cfg)
    training, optim_, backup_s = settings.training, settings.optimization, settings.backup
    opts = settings.instruments
    extra = instruments.active(opts)  # e.g. the benchmarks' slow worker
    loop.set_up(settings)  # as the fit loop; float16 losses are scaled in `step` below
    spec = cluster.tf_config["cluster"]
    workers = spec["worker"]
    # Before the strategy opens channels to the tasks: a worker whose host
    # vanishes must fail its pending step, not hold it for ~15 minutes.
    grpc_keepalive.apply()
    options = settings.adapter
    strategy = strategies.build_strategy("parameter_server", cluster, options)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    gbs = training.global_batch_size
    lr = data.scale_learning_rate(optim_.learning_rate, gbs, optim_.base_batch_size or gbs,
                                  optim_.lr_scaling)
    train_source = recipe_lib.build_dataset(recipe, cfg, "train")
    train_unbatched = data.as_source(train_source).dataset
    num_examples = data.count_elements(train_unbatched)
    steps_per_epoch = training.steps_per_epoch or max(1, num_examples // gbs)
    _log(loop.run_line({
        "recipe": recipe.RECIPE_NAME, "strategy": "parameter_server", "workers": len(workers),
        "ps": len(spec["ps"]), "batch_per_step": gbs, "steps_per_epoch": steps_per_epoch,
        "learning_rate": lr, "precision": optim_.precision, "ps_shards": options.ps_shards,
        **{k: v for i in extra for k, v in i.line_fields(opts).items()}}))

    compile_kwargs = recipe_lib.compile_kwargs(recipe, cfg)
    with strategy.scope():
        model = recipe_lib.build_model(recipe, cfg)
        optimizer = recipe_lib.build_optimizer(recipe, cfg, lr, settings.optimization)
        model.compile(optimizer=optimizer, loss=compile_kwargs.get("loss"))
        # Create every variable (weights, optimizer slots, loss state) here, eagerly:
        # scheduled functions run on workers and may not create variables.
        x0, y0, w0 = keras.utils.unpack_x_y_sample_weight(
            next(iter(train_unbatched.batch(2))))
        model.compute_loss(x=x0, y=y0, y_pred=model(x0, training=False), sample_weight=w0,
                           training=False)
        optimizer.build(model.trainable_variables)

    shuffle_buffer, seed, num_workers = training.shuffle_buffer, training.seed, len(workers)

    writer = writer or ChiefWriter(model_dir_for(cfg, recipe.RECIPE_NAME, cluster),
                                   cluster.is_chief)
    model_dir = writer.model_dir
    check_free_space(model_dir, cluster, model, optimizer)
    store = BackupStore(writer, keep=backup_s.keep)
    meta = {"recipe": recipe.RECIPE_NAME, "num_replicas": len(workers), "global_batch_size": gbs,
            "config": run_dir.run_config(cfg), "epochs": training.epochs}  # for reruns
    # Assignments inside the scope go to the ps tasks.
    restored, latest = store.resume(backup_s.resume, meta, model.variables, optimizer.variables,
                                    strategy.scope)
    state = restored or TrainState(history={"loss": []})
    if restored:
        _log(f"resumed from {latest}: epoch {state.epoch} (global step {state.global_step})")
    elif latest:
        _log(f"--no-resume: removed old backups in {store.directory}")

    def dataset_fn(_input_context):
        source = recipe_lib.build_dataset(recipe, cfg, "train")
        ds = data.as_source(source).dataset
        # Disjoint shards: without this every worker would read the same examples.
        index = tf.distribute.coordinator.experimental_get_current_worker_index()
        ds = ds.shard(num_workers, index)
        if shuffle_buffer > 0:
            ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        return ds.repeat().batch(gbs, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    @tf.function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(dataset_fn)

    iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))

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
                loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                          training=True)
                # Scaled under mixed_float16 (a LossScaleOptimizer), which apply() unscales.
                scaled = model.optimizer.scale_loss(loss)
            grads = tape.gradient(scaled, model.trainable_variables)
            model.optimizer.apply(grads, model.trainable_variables)
            return loss

        with tf.control_dependencies(deps):  # a straggler sleeps first, as a slow machine
            batch = next(iterator)
        loss = strategy.run(replica_fn, args=(batch,))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, loss, axis=None), index

    # Keras's TensorBoard callback, driven by this loop as fit drives it (chief only).
    tensorboard = callbacks.make_tensorboard(writer) if settings.logs.tensorboard else None
    if tensorboard is not None:
        tensorboard.set_model(model)
        tensorboard.on_train_begin()
    # The same chief-only history.csv the fit loop writes, rewritten each epoch.
    csv_log = callbacks.make_csv_logger(writer, state) if settings.logs.csv_log else None
    history = state.history
    steps_per_worker = [0] * num_workers
    lost: dict[int, int] = {}  # worker index -> epoch it was first found unreachable
    start = time.perf_counter()
    try:
        for epoch in range(state.epoch, training.epochs):
            results = [coordinator.schedule(step, args=(iterator,))
                       for _ in range(steps_per_epoch)]
            coordinator.join()
            fetched = coordinator.fetch(results)
            losses = [float(loss) for loss, _ in fetched]
            for _, index in fetched:
                steps_per_worker[int(index)] += 1
            history["loss"].append(sum(losses) / len(losses))
            for i, address in enumerate(workers):
                if i not in lost and not reachable(address):
                    lost[i] = epoch
                    _log(f"worker {i} at {address} is unreachable; the coordinator re-runs "
                         "its steps on the other workers and training goes on")
            _log(f"epoch {epoch + 1}/{training.epochs} loss={history['loss'][-1]:.4f} "
                 f"steps_per_worker={steps_per_worker} lost_workers={sorted(lost)}")
            state.epoch, state.global_step = epoch + 1, state.global_step + steps_per_epoch
            if tensorboard is not None:
                tensorboard.on_epoch_end(epoch, {"loss": history["loss"][-1]})
            if csv_log is not None:
                csv_log.on_epoch_end(epoch, {"loss": history["loss"][-1]})
            store.save(state, model.variables, optimizer.variables, meta)
    except (tf.errors.OpError, ClusterError) as e:
        if _is_ps_error(e):
            raise _lost_ps_error(e, spec) from None
        raise
    finally:
        if tensorboard is not None:
            tensorboard.on_train_end()  # closes its event files
    wall = time.perf_counter() - start

    # Gather the trained weights from the ps into an ordinary Keras model: it
    # evaluates on the chief and saves as a model any strategy can load.
    local = recipe_lib.build_model(recipe, cfg)
    local.set_weights([w.numpy() if hasattr(w, "numpy") else w for w in model.get_weights()])
    local.compile(**compile_kwargs)
    test_ds = data.prepare(recipe_lib.build_dataset(recipe, cfg, "test"), gbs, training=False)
    total_steps = sum(steps_per_worker)  # this run's steps (a resumed run did fewer)
    metrics = {
        "recipe": recipe.RECIPE_NAME,
        "strategy": "parameter_server",
        "num_workers": num_workers,
        "num_ps": len(spec["ps"]),
        "ps_shards": options.ps_shards,
        "precision": optim_.precision,
        "global_batch_size": gbs,
        "learning_rate": lr,
        "epochs": training.epochs,
        "steps": total_steps,
        "global_step": state.global_step,
        "steps_per_worker": steps_per_worker,
        "lost_workers": [{"worker": i, "address": workers[i], "found_in_epoch": e + 1}
                         for i, e in sorted(lost.items())],
        **{k: v for i in extra for k, v in i.describe(opts).items()},
        "history": history,
        "wall_time_s": wall,
        "examples_per_s": total_steps * gbs / wall if wall > 0 else 0.0,
    }
    if lost:
        _log(f"finished without lost worker(s) {sorted(lost)}: "
             + ", ".join(f"worker {i} ({workers[i]})" for i in sorted(lost)))
    metrics = loop.finish(local, test_ds, metrics, writer, cluster, recipe, cfg)
    return Result(model=local, metrics=metrics, strategy=strategy, cluster=cluster)


class CoordinatorLoop(loop.Loop):
    """The parameter-server loop: the chief coordinates, workers and ps tasks serve.

    The run pipeline has checked the cluster and the options
    (`tfdist.strategies.parameter_server.ParameterServer.check_config`).
    """

    kind = "coordinator"

    def run(self, run: loop.Run):
        """Runs this process's part of a parameter-server job.

        Returns:
            A `tfdist.run.types.Result`; on workers and ps tasks its model is None
            (they return only when their chief has gone).
        """
        from tfdist import instruments

        cfg, cluster = run.cfg, run.cluster
        recipe_lib.check_hooks_for_own_loop(run.recipe, "parameter_server")
        num_workers = len(cluster.tf_config["cluster"]["worker"])
        opts = run.settings.instruments
        for instrument in instruments.active(opts):  # counted among the PS job's workers
            instrument.check(opts, num_workers)
        loop.start_tensorflow(run.settings)
        if cluster.task_type in ("worker", "ps"):
            from tfdist.ps import server

            return server.serve(cluster, run.settings.runtime.threads)
        if cluster.task_type != "chief":
            raise ClusterError(f"task type {cluster.task_type!r} has no role in "
                               "parameter-server training; valid: chief, worker, ps.")
        return train(run.recipe, cfg, cluster, run.writer, run.settings)
