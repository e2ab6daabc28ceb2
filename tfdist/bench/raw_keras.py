"""`python -m tfdist.bench.raw_keras SPEC_JSON`: the overhead baseline, no tfdist trainer in the loop.

What a user would write by hand with the same engine: the recipe's model,
data and loss, Keras SGD with the recipe's learning rate and momentum,
`model.fit` on a batched, repeated dataset. `spec["engine"]`:

* "single": TensorFlow's default strategy (what tfdist's `single` uses).
* "multi_worker": MultiWorkerMirroredStrategy from TF_CONFIG with the ring
  collective; it also needs tfdist's Keras 3 MWMS workaround
  (`tfdist.compat.keras_mwms`), without which `fit` fails upstream
  (keras-team/keras#20585): that patch is not overhead.
* "horovod": `hvd.init()`, each rank its shard of the data, the optimizer
  wrapped by `tfdist.horovod.DistributedOptimizer` and rank 0's state
  broadcast, as Horovod's docs prescribe (Horovod's own Keras wrapper does
  not work under Keras 3, so its Keras 3 port stands in for it).
* "shm": `tfdist.shm.init` from TF_CONFIG, each rank its shard,
  `shm.DistributedOptimizer` and `shm.BroadcastInitialState`: the engine's
  public API, without the trainer.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, NamedTuple

ENGINES = ("single", "multi_worker", "horovod", "shm")


class Engine(NamedTuple):
    """An engine set up by hand: what `build` and `fit` need from it."""

    strategy: Any
    rank: int
    size: int  # processes that each read their own slice (1: the strategy shards)
    wrap: Callable  # optimizer -> the engine's distributed optimizer
    callbacks: list  # e.g. broadcasting rank 0's initial state


def set_up(engine: str, tf_config: dict | None) -> Engine:
    """Sets `engine` up by hand, as its own docs prescribe (once per process)."""
    import tensorflow as tf

    if engine == "multi_worker":
        from tfdist.compat import keras_mwms

        keras_mwms.apply()
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=tf.distribute.experimental.CommunicationImplementation.RING))
        return attach(engine, strategy, tf_config)
    if engine == "horovod":
        import horovod.tensorflow as hvd

        hvd.init()
    if engine == "shm":
        from tfdist import shm

        workers = tf_config["cluster"]["worker"]
        host, port = workers[0].rsplit(":", 1)
        shm.init(tf_config["task"]["index"], len(workers), (host, int(port)))
    return attach(engine, tf.distribute.get_strategy(), tf_config)


def attach(engine: str, strategy, tf_config: dict | None) -> Engine:
    """The `Engine` of `engine` already set up in this process (by `set_up` or by tfdist).

    Args:
        engine: One of ENGINES.
        strategy: The strategy that was built (MultiWorkerMirrored's, else the default).
        tf_config: The parsed TF_CONFIG (multi_worker, shm), or None.
    """
    if engine == "multi_worker":
        # MWMS shards the global batch itself: every process reads the whole dataset.
        return Engine(strategy, tf_config["task"]["index"], 1, lambda o: o, [])
    if engine == "horovod":
        import horovod.tensorflow as hvd

        from tfdist import horovod as thvd
        from tfdist.horovod import callbacks as hvd_callbacks

        return Engine(strategy, hvd.rank(), hvd.size(), thvd.DistributedOptimizer,
                      [hvd_callbacks.BroadcastInitialState(root_rank=0)])
    if engine == "shm":
        from tfdist import shm

        comm = shm.communicator()
        return Engine(strategy, comm.rank, comm.size, shm.DistributedOptimizer,
                      [shm.BroadcastInitialState(root=0)])
    return Engine(strategy, 0, 1, lambda o: o, [])


def resolve_engine(spec: dict, tf_config: dict | None) -> str:
    """Pure function: spec["engine"], checked; "single" when one process has nothing to share."""
    engine = spec.get("engine", "multi_worker")
    if engine not in ENGINES:
        raise SystemExit(f"error: engine must be one of {ENGINES}. Received: {engine!r}.")
    if engine in ("multi_worker", "shm") and not (tf_config and
                                                  len(tf_config["cluster"]["worker"]) > 1):
        return "single"  # one process: nothing to distribute
    return engine


def build(spec: dict, engine: str, eng: Engine):
    """(model, dataset): the recipe's model compiled with plain SGD, and its batched data."""
    import keras
    import tensorflow as tf

    from tfdist import recipe as recipe_lib

    from tfdist import config
    from tfdist.settings import Settings

    recipe = recipe_lib.load(spec["recipe"])
    # The options tfdist would train with (its defaults under the recipe's), so the
    # baseline's optimizer is the same one without a second declaration of defaults.
    cfg = {**config.merge(recipe.DEFAULTS, [], f"recipe {spec['recipe']}"),
           **spec.get("overrides", {})}
    optim_ = Settings.of(cfg).optimization
    keras.utils.set_random_seed(0)
    ds = recipe.build_dataset(cfg, "train")
    if eng.size > 1:  # one replica per process: each reads its slice of every global batch
        ds = ds.shard(eng.size, eng.rank)
    ds = ds.batch(spec["global_batch_size"] // eng.size, drop_remainder=True)
    ds = ds.repeat().prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    ds = ds.with_options(options)
    with eng.strategy.scope():
        model = recipe.build_model(cfg)
        optimizer = eng.wrap(keras.optimizers.SGD(optim_.learning_rate,
                                                  momentum=optim_.momentum))
        # shm's all-reduce is a numpy_function, which XLA cannot compile.
        model.compile(optimizer=optimizer, **recipe.compile_kwargs(cfg),
                      **({"jit_compile": False} if engine == "shm" else {}))
    return model, ds


def fit_by_hand(spec: dict, engine: str, steps: int, callback) -> Engine:
    """Sets `engine` up by hand, then fits the recipe's model `steps` steps with `callback`.

    The whole baseline in one process: `main`'s run, and the A/A control of
    `tfdist.bench.paired_worker` (where it takes the trainer's place).
    """
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(spec["threads"])
    eng = set_up(engine, json.loads(os.environ.get("TF_CONFIG", "null")))
    model, ds = build(spec, engine, eng)
    model.fit(ds, epochs=1, steps_per_epoch=steps, verbose=0, shuffle=False,
              callbacks=[*eng.callbacks, callback])
    return eng


def main(spec: dict) -> int:
    from tfdist.bench import runs, timing

    engine = resolve_engine(spec, json.loads(os.environ.get("TF_CONFIG", "null")))
    timer = timing.step_timer()
    eng = fit_by_hand(spec, engine, spec["steps"], timer)
    if eng.rank == 0:
        step_s = timing.steady_step_s(timer.times, spec["warmup"])
        runs.emit({"engine": engine, "steps": len(timer.times), "step_s": step_s,
                   "examples_per_s": spec["global_batch_size"] / step_s})
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
