"""Test worker: where does Keras clip under MirroredStrategy? Prints JSON.

    python tests/workers/clip_reduction.py keras|tfdist

Two replicas on 2 logical CPUs pass different gradients to one SGD step with
global_clipnorm=1 (lr=1, variable starting at 0), as Keras's train_step does
after scaling the loss by 1/replicas. On one device the step would clip the
summed gradient [1.5, 2.0] (norm 2.5) to [0.6, 0.8]. Also runs gradient
accumulation (2 micro-steps) with the same replicas.
"""

import json
import sys


def main():
    mode = sys.argv[1]
    from tfdist.strategies.devices import configure_runtime

    configure_runtime(cpu_devices=2)
    import keras
    import tensorflow as tf

    from tfdist.compat import keras_grad_reduction

    if mode == "tfdist":
        keras_grad_reduction.apply()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    out = {}
    with strategy.scope():
        v = keras.Variable([0.0, 0.0])
        opt = keras.optimizers.SGD(learning_rate=1.0, global_clipnorm=1.0)
        opt.build([v])
        acc_v = keras.Variable([0.0, 0.0])
        acc_opt = keras.optimizers.SGD(learning_rate=1.0, gradient_accumulation_steps=2)
        acc_opt.build([acc_v])

    local = tf.constant([[1.5, 0.0], [0.0, 2.0]])

    def step(optimizer, var):
        # Variables are captured, not passed: a Keras Variable passed to a
        # tf.function becomes a symbolic tensor.
        @tf.function
        def run():
            def replica_fn():
                r = tf.distribute.get_replica_context().replica_id_in_sync_group
                optimizer.apply([tf.gather(local, r)], [var])
            strategy.run(replica_fn)

        run()

    try:
        step(opt, v)
        out["clipped"] = [float(x) for x in v.numpy()]
    except Exception as e:  # report, do not hide
        out["clipped_error"] = f"{type(e).__name__}: {str(e)}"
    try:
        step(acc_opt, acc_v)
        step(acc_opt, acc_v)
        out["accumulated"] = [float(x) for x in acc_v.numpy()]
    except Exception as e:
        out["accumulated_error"] = f"{type(e).__name__}: {str(e)}"
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
