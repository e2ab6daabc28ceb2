"""`python -m tfdist.bench.raw_keras SPEC_JSON`: the overhead baseline, no tfdist in the loop.

What a user would write by hand on raw tf.distribute + Keras: the recipe's
model, data and loss, Keras SGD with the recipe's learning rate and momentum,
`model.fit` on a batched, repeated dataset. One process uses TensorFlow's
default strategy (what tfdist's `single` uses); under TF_CONFIG it builds
MultiWorkerMirroredStrategy with the ring collective, and then also needs
tfdist's Keras 3 MWMS workaround (`tfdist.compat.keras_mwms`), without which
`fit` fails upstream (keras-team/keras#20585): that patch is not overhead.
"""

from __future__ import annotations

import json
import os
import sys


def main(spec: dict) -> int:
    import keras
    import tensorflow as tf

    from tfdist import recipe as recipe_lib
    from tfdist.bench import runs, timing

    tf.config.threading.set_intra_op_parallelism_threads(spec["threads"])
    recipe = recipe_lib.load(spec["recipe"])
    cfg = {**recipe.DEFAULTS, **spec.get("overrides", {})}
    tf_config = json.loads(os.environ.get("TF_CONFIG", "null"))
    if tf_config and len(tf_config["cluster"]["worker"]) > 1:
        from tfdist.compat import keras_mwms

        keras_mwms.apply()
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=tf.distribute.experimental.CommunicationImplementation.RING))
        is_chief = tf_config["task"]["index"] == 0
    else:
        strategy, is_chief = tf.distribute.get_strategy(), True
    keras.utils.set_random_seed(0)
    ds = recipe.build_dataset(cfg, "train").batch(spec["global_batch_size"], drop_remainder=True)
    ds = ds.repeat().prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    ds = ds.with_options(options)
    with strategy.scope():
        model = recipe.build_model(cfg)
        model.compile(optimizer=keras.optimizers.SGD(cfg.get("learning_rate", 0.05),
                                                     momentum=cfg.get("momentum", 0.0)),
                      **recipe.compile_kwargs(cfg))
    timer = timing.step_timer()
    model.fit(ds, epochs=1, steps_per_epoch=spec["steps"], verbose=0, callbacks=[timer])
    if is_chief:
        step_s = timing.steady_step_s(timer.times, spec["warmup"])
        runs.emit({"steps": len(timer.times), "step_s": step_s,
                   "examples_per_s": spec["global_batch_size"] / step_s})
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
