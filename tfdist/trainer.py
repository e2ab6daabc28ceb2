"""The training run: recipe + config + cluster -> trained model and metrics.

This is the library entry the CLI (`tfdist.train`) calls; it knows nothing of
argument parsing. Order matters: devices and threads are configured and the
strategy is built before any TensorFlow op runs, as TensorFlow requires.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

from tfdist import cluster as cluster_lib
from tfdist import data, straggler, strategies
from tfdist.checkpoint import ChiefWriter


@dataclasses.dataclass
class Result:
    """What `train` returns.

    Attributes:
        model: The trained Keras model.
        metrics: The dict written to metrics.json (on every worker).
        strategy: The tf.distribute.Strategy used.
        cluster: The ClusterInfo of this process.
    """

    model: object
    metrics: dict
    strategy: object
    cluster: cluster_lib.ClusterInfo


def model_dir_for(cfg: dict, recipe_name: str) -> str:
    """The model dir: `cfg["model_dir"]`, or runs/RECIPE by default."""
    return cfg["model_dir"] or os.path.join("runs", recipe_name)


def check_before_tensorflow(cfg: dict, cluster) -> None:
    """Validates what can be validated without starting TensorFlow.

    Raises:
        ConfigError: for an unknown strategy, a batch that cannot divide, a
            bad scaling rule.
    """
    strategies.check_name(cfg["strategy"])
    data.scale_learning_rate(cfg["learning_rate"], cfg["global_batch_size"],
                             cfg["base_batch_size"] or cfg["global_batch_size"], cfg["lr_scaling"])
    # Replica counts known before TensorFlow starts (CPU-only layouts).
    if cfg["strategy"] == "mirrored" and cfg["devices"] > 1:
        data.per_replica_batch_size(cfg["global_batch_size"], cfg["devices"])
    if cfg["strategy"] in ("multi_worker", "auto") and cluster.is_multi_worker:
        data.per_replica_batch_size(cfg["global_batch_size"], cluster.num_workers)
    straggler.check(cfg["straggler_delay_ms"], cfg["straggler_worker"], cluster.num_workers)


class _Counter:
    """Counts training steps (as a Keras callback) for examples/s."""

    def __new__(cls):
        import keras

        class Counter(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.steps = 0

            def on_train_batch_end(self, batch, logs=None):
                self.steps += 1

        return Counter()


def _log(cluster, message: str) -> None:
    if cluster.is_chief:
        print(f"tfdist: {message}", flush=True)


def train(recipe, cfg: dict, cluster=None) -> Result:
    """Trains `recipe` as configured by `cfg` on the discovered cluster.

    Args:
        recipe: A loaded recipe module (see `tfdist.recipe`).
        cfg: The merged configuration (see `tfdist.config.merge`).
        cluster: ClusterInfo; discovered from the environment when None.

    Returns:
        A Result. The chief also writes MODEL_DIR/model.keras and
        MODEL_DIR/metrics.json; other workers write nothing there.
    """
    cluster = cluster or cluster_lib.detect()
    if cfg["strategy"] == "parameter_server" or (
            cfg["strategy"] == "auto" and strategies.has_ps_tasks(cluster)):
        from tfdist import ps  # asynchronous training has its own loop

        return ps.run(recipe, cfg, cluster)
    check_before_tensorflow(cfg, cluster)

    import keras
    import tensorflow as tf

    from tfdist.strategies.devices import configure_runtime, gpu_count

    cpu_devices = cfg["devices"] if cfg["devices"] > 1 and gpu_count() == 0 else None
    configure_runtime(cpu_devices=cpu_devices, intra_op_threads=cfg["threads"] or None)
    if cfg["deterministic"]:
        tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(cfg["seed"])

    options = strategies.StrategyOptions(
        devices=cfg["devices"] or None, collective=cfg["collective"],
        timeout_s=cfg["collective_timeout_s"])
    name = strategies.resolve_name(cfg["strategy"], cluster, options.devices, gpu_count())
    strategy = strategies.build_strategy(name, cluster, options)
    replicas = strategy.num_replicas_in_sync
    gbs = cfg["global_batch_size"]
    per_replica = data.per_replica_batch_size(gbs, replicas)
    lr = data.scale_learning_rate(cfg["learning_rate"], gbs, cfg["base_batch_size"] or gbs,
                                  cfg["lr_scaling"])
    _log(cluster, f"recipe={recipe.RECIPE_NAME} strategy={name} num_replicas={replicas} "
                  f"workers={cluster.num_workers} source={cluster.source} "
                  f"global_batch_size={gbs} per_replica_batch_size={per_replica} "
                  f"learning_rate={lr:g}")

    train_ds = data.prepare(recipe.build_dataset(cfg, "train"), gbs,
                            num_workers=cluster.num_workers, training=True,
                            shuffle_buffer=cfg["shuffle_buffer"], seed=cfg["seed"])
    test_ds = data.prepare(recipe.build_dataset(cfg, "test"), gbs,
                           num_workers=cluster.num_workers, training=False)
    policy = train_ds.options().experimental_distribute.auto_shard_policy.name
    _log(cluster, f"input sharding: AutoShardPolicy.{policy}")

    with strategy.scope():
        model = recipe.build_model(cfg)
        opt_config = {"learning_rate": lr}
        if cfg["optimizer"] == "sgd":
            opt_config["momentum"] = cfg["momentum"]
        optimizer = keras.optimizers.get({"class_name": cfg["optimizer"], "config": opt_config})
        compile_kwargs = recipe.compile_kwargs(cfg) if hasattr(recipe, "compile_kwargs") else {}
        model.compile(optimizer=optimizer, **compile_kwargs)

    counter = _Counter()
    callbacks = [counter]
    if cfg["straggler_delay_ms"] and cluster.worker_index == cfg["straggler_worker"]:
        callbacks.append(straggler.keras_callback(cfg["straggler_delay_ms"]))
    start = time.perf_counter()
    history = model.fit(train_ds, epochs=cfg["epochs"],
                        steps_per_epoch=cfg["steps_per_epoch"] or None,
                        verbose=cfg["verbose"] if cluster.is_chief else 0,
                        callbacks=callbacks, shuffle=False)  # shuffling is data.prepare's job
    wall = time.perf_counter() - start
    evaluation = model.evaluate(test_ds, verbose=0, return_dict=True)

    metrics = {
        "recipe": recipe.RECIPE_NAME,
        "strategy": name,
        "num_replicas": replicas,
        "num_workers": cluster.num_workers,
        "global_batch_size": gbs,
        "learning_rate": lr,
        "shard_policy": policy,
        "epochs": cfg["epochs"],
        "history": {k: [float(x) for x in v] for k, v in history.history.items()},
        "test": {k: float(v) for k, v in evaluation.items()},
        "wall_time_s": wall,
        "examples_per_s": counter.steps * gbs / wall if wall > 0 else 0.0,
    }
    writer = ChiefWriter(model_dir_for(cfg, recipe.RECIPE_NAME), cluster.is_chief)
    writer.save_model(model)
    path = writer.write_json("metrics.json", metrics)
    if path:
        _log(cluster, f"test {evaluation}; wrote {writer.path('model.keras')} and {path}")
    sys.stdout.flush()
    return Result(model=model, metrics=metrics, strategy=strategy, cluster=cluster)
