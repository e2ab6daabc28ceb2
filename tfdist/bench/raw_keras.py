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

ENGINES = ("single", "multi_worker", "horovod", "shm")


def _strategy_and_rank(engine: str, tf_config: dict | None):
    """(strategy, rank, size, wrap optimizer, callbacks) for `engine`, set up by hand."""
    import tensorflow as tf

    if engine == "multi_worker":
        from tfdist.compat import keras_mwms

        keras_mwms.apply()
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=tf.distribute.experimental.CommunicationImplementation.RING))
        # MWMS shards the global batch itself: every process reads the whole dataset.
        return strategy, tf_config["task"]["index"], 1, (lambda o: o), []
    if engine == "horovod":
        import horovod.tensorflow as hvd

        from tfdist import horovod as thvd
        from tfdist.horovod import callbacks as hvd_callbacks

        hvd.init()
        return (tf.distribute.get_strategy(), hvd.rank(), hvd.size(), thvd.DistributedOptimizer,
                [hvd_callbacks.BroadcastInitialState(root_rank=0)])
    if engine == "shm":
        from tfdist import shm

        workers = tf_config["cluster"]["worker"]
        host, port = workers[0].rsplit(":", 1)
        rank = tf_config["task"]["index"]
        shm.init(rank, len(workers), (host, int(port)))
        return (tf.distribute.get_strategy(), rank, len(workers), shm.DistributedOptimizer,
                [shm.BroadcastInitialState(root=0)])
    return tf.distribute.get_strategy(), 0, 1, (lambda o: o), []


def main(spec: dict) -> int:
    import keras
    import tensorflow as tf

    from tfdist import recipe as recipe_lib
    from tfdist.bench import runs, timing

    tf.config.threading.set_intra_op_parallelism_threads(spec["threads"])
    engine = spec.get("engine", "multi_worker")
    if engine not in ENGINES:
        raise SystemExit(f"error: engine must be one of {ENGINES}. Received: {engine!r}.")
    recipe = recipe_lib.load(spec["recipe"])
    cfg = {**recipe.DEFAULTS, **spec.get("overrides", {})}
    tf_config = json.loads(os.environ.get("TF_CONFIG", "null"))
    if engine in ("multi_worker", "shm") and not (tf_config and
                                                  len(tf_config["cluster"]["worker"]) > 1):
        engine = "single"  # one process: nothing to distribute
    strategy, rank, size, wrap, callbacks = _strategy_and_rank(engine, tf_config)
    keras.utils.set_random_seed(0)
    ds = recipe.build_dataset(cfg, "train")
    if size > 1:  # one replica per process: each reads its slice of every global batch
        ds = ds.shard(size, rank)
    ds = ds.batch(spec["global_batch_size"] // size, drop_remainder=True)
    ds = ds.repeat().prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    ds = ds.with_options(options)
    with strategy.scope():
        model = recipe.build_model(cfg)
        optimizer = wrap(keras.optimizers.SGD(cfg.get("learning_rate", 0.05),
                                              momentum=cfg.get("momentum", 0.0)))
        # shm's all-reduce is a numpy_function, which XLA cannot compile.
        model.compile(optimizer=optimizer, **recipe.compile_kwargs(cfg),
                      **({"jit_compile": False} if engine == "shm" else {}))
    timer = timing.step_timer()
    model.fit(ds, epochs=1, steps_per_epoch=spec["steps"], verbose=0,
              callbacks=[*callbacks, timer])
    if rank == 0:
        step_s = timing.steady_step_s(timer.times, spec["warmup"])
        runs.emit({"engine": engine, "steps": len(timer.times), "step_s": step_s,
                   "examples_per_s": spec["global_batch_size"] / step_s})
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
