"""Test worker: the Keras 3 Horovod wrappers, and upstream's failures, on real ranks.

    horovodrun -np 2 -H localhost:2 --gloo python tests/workers/hvd_checks.py

Each check runs on every rank, compares values it can compute by hand (rank r
contributes r + 1, so the average over 2 ranks is 1.5 and the sum 3) and
prints `CHECK <name> ok rank=<r>`; a failed check prints `CHECK <name> FAIL`
with the reason. The test asserts every check passed on every rank.
"""

import os
import sys
import tempfile
import traceback

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfdist import horovod as thvd  # noqa: E402
from tfdist.horovod import callbacks, lr_callbacks, runtime  # noqa: E402

hvd = runtime.hvd()
RANK, SIZE = hvd.rank(), hvd.size()
C = float(RANK + 1)  # this rank's gradient value
MEAN = sum(r + 1.0 for r in range(SIZE)) / SIZE
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def gathered(x):
    """Every rank's value of x, stacked (rank order)."""
    return hvd.allgather(tf.reshape(tf.convert_to_tensor(x), [1, -1])).numpy()


def one_step(optimizer, grad_value, variable=None):
    w = variable if variable is not None else keras.Variable(np.zeros(4, "float32"))
    optimizer.apply([tf.fill([4], grad_value)], [w])
    return w


@check
def average_eager():
    w = one_step(thvd.DistributedOptimizer(keras.optimizers.SGD(1.0)), C)
    np.testing.assert_allclose(w.numpy(), -MEAN)


@check
def average_custom_loop_tf_function():
    opt = thvd.DistributedOptimizer(keras.optimizers.SGD(1.0))
    w = keras.Variable(np.zeros(4, "float32"))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w.value * C)
        opt.apply(tape.gradient(loss, [w.value]), [w])

    step(), step()
    np.testing.assert_allclose(w.numpy(), -2 * MEAN)


@check
def op_sum():
    w = one_step(thvd.DistributedOptimizer(keras.optimizers.SGD(1.0), op="sum"), C)
    np.testing.assert_allclose(w.numpy(), -MEAN * SIZE)


@check
def fp16_compression():
    # 1.5 and 3 are exact in float16, so compression must not change them.
    w = one_step(thvd.DistributedOptimizer(keras.optimizers.SGD(1.0), compression="fp16"), C)
    assert w.dtype == "float32", w.dtype
    np.testing.assert_allclose(w.numpy(), -MEAN)
    # A value float16 cannot hold shows the compression really happened.
    w = one_step(thvd.DistributedOptimizer(keras.optimizers.SGD(1.0), compression="fp16"),
                 1.0 + 1e-4)
    np.testing.assert_allclose(w.numpy(), -1.0)


@check
def backward_passes_per_step():
    opt = thvd.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=2)
    w = one_step(opt, C)
    np.testing.assert_allclose(w.numpy(), 0.0)  # first pass only accumulates
    one_step(opt, 3 * C, w)
    # mean over passes (C + 3C) / 2 = 2C, then over ranks: 2 * MEAN
    np.testing.assert_allclose(w.numpy(), -2 * MEAN)


def _sparse(sparse_as_dense):
    emb = keras.layers.Embedding(4, 2, embeddings_initializer="zeros")
    emb.build((None,))
    opt = thvd.DistributedOptimizer(keras.optimizers.SGD(1.0), sparse_as_dense=sparse_as_dense)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(emb(tf.constant([RANK])))
    grads = tape.gradient(loss, emb.trainable_variables)
    assert isinstance(grads[0], tf.IndexedSlices), type(grads[0])
    opt.apply(grads, emb.trainable_variables)
    expected = np.zeros((4, 2), "float32")
    expected[:SIZE] = -1.0 / SIZE  # each rank's row, averaged over ranks
    np.testing.assert_allclose(emb.embeddings.numpy(), expected)


@check
def sparse_indexed_slices():
    _sparse(False)


@check
def sparse_as_dense():
    _sparse(True)


@check
def unwrapped_optimizer_diverges():
    # The control: without the wrapper each rank applies its own gradient.
    w = one_step(keras.optimizers.SGD(1.0), C)
    np.testing.assert_allclose(w.numpy(), -C)
    assert len({float(v[0]) for v in gathered(w.value)}) == SIZE


@check
def broadcast_state_resumed():
    keras.utils.set_random_seed(100 + RANK)  # different init on every rank
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    opt = keras.optimizers.SGD(0.1, momentum=0.9)
    opt.build(model.trainable_variables)
    assert len({float(v[0]) for v in gathered(model.variables[0].value)}) == SIZE
    if RANK == 0:  # rank 0 "restored a checkpoint"
        model.set_weights([np.full(w.shape, 0.25, "float32") for w in model.get_weights()])
        opt.iterations.assign(7)
        for v in opt.variables:
            if v is not opt.iterations and "momentum" in v.path:
                v.assign(np.full(v.shape, 0.5, "float32"))
    thvd.broadcast_state(model, opt)
    for w in model.get_weights():
        np.testing.assert_allclose(w, 0.25)
    assert int(opt.iterations.numpy()) == 7
    momenta = [v for v in opt.variables if "momentum" in v.path]
    assert momenta and all(np.allclose(v.numpy(), 0.5) for v in momenta)


@check
def broadcast_variables_a_group_at_a_time():
    from tfdist.collectives import keras_callbacks

    # Each rank its own values; a group per variable (16 bytes): every group still pairs.
    variables = [tf.Variable(np.full([3], C + i, "float32")) for i in range(3)]
    variables.append(keras.Variable(np.full([2, 2], C, "float32")))
    limit, keras_callbacks.BROADCAST_GROUP_BYTES = keras_callbacks.BROADCAST_GROUP_BYTES, 16
    try:
        thvd.broadcast_variables(variables, root_rank=0)
    finally:
        keras_callbacks.BROADCAST_GROUP_BYTES = limit
    for i, v in enumerate(variables[:3]):
        np.testing.assert_array_equal(v.numpy(), np.full([3], 1.0 + i))
    np.testing.assert_array_equal(np.asarray(variables[3].numpy()), np.ones([2, 2]))


@check
def broadcast_builds_unbuilt_optimizer():
    keras.utils.set_random_seed(200 + RANK)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    opt = keras.optimizers.Adam(0.1)
    thvd.broadcast_state(model, opt)
    assert opt.built
    assert len({float(v[0]) for v in gathered(model.variables[0].value)}) == 1


@check
def metric_average():
    logs = {"loss": C, "accuracy": 10.0 * RANK, "name": "not a number"}
    callbacks.MetricAverage().on_epoch_end(0, logs)
    assert logs["loss"] == MEAN and logs["accuracy"] == 10.0 * (SIZE - 1) / 2, logs
    assert logs["name"] == "not a number"


@check
def warmup_uses_hvd_size():
    cb = lr_callbacks.LearningRateWarmup(0.1, warmup_epochs=1, steps_per_epoch=4)
    cb.on_train_begin()
    assert cb.size == SIZE


@check
def saved_model_has_plain_optimizer():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=thvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    model.fit(np.ones((4, 3), "float32"), np.ones((4, 2), "float32"), verbose=0)
    path = os.path.join(tempfile.mkdtemp(), "m.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert type(loaded.optimizer) is keras.optimizers.SGD, type(loaded.optimizer)


# Upstream horovod 0.28.1 on Keras 3 (tfdist.compat.horovod_keras).

@check
def upstream_4290_broadcast_callback():
    import horovod.tensorflow.keras as hk

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    cb = hk.callbacks.BroadcastGlobalVariablesCallback(0)
    cb.set_model(model)
    try:
        cb.on_batch_end(0)
    except AttributeError as e:
        assert "'Variable' object has no attribute 'ref'" in str(e), e
    else:
        raise AssertionError("horovod#4290 no longer reproduces: revisit tfdist.horovod.broadcast")


@check
def upstream_broadcast_variables():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    try:
        hvd.broadcast_variables(model.variables, 0)
    except AttributeError as e:
        assert "has no attribute 'assign'" in str(e), e
    else:
        raise AssertionError("hvd.broadcast_variables now works on Keras 3 variables")


@check
def loss_scale_agrees_on_overflow():
    # mixed_float16, one replica per rank: rank 1 alone overflows in step 1;
    # every rank must skip it (and halve the scale), then apply step 2 averaged.
    from tfdist.strategies.horovod import HorovodHooks

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        opt = HorovodHooks(None).wrap_optimizer(keras.optimizers.SGD(1.0))
        assert type(opt).__name__ == "LossScaleOptimizer", type(opt)
        w = keras.Variable(np.zeros(4, "float32"))

        @tf.function
        def step(value):
            opt.apply([tf.fill([4], value)], [w])

        step(tf.constant(np.inf if RANK == 1 else C, tf.float32))
        step(tf.constant(C, tf.float32))
        scales = gathered(opt.dynamic_scale.value)
        assert np.all(scales == 2.0 ** 14), scales
        np.testing.assert_allclose(w.numpy(), -MEAN / 2.0 ** 14)  # exact in float32
        assert len({float(v[0]) for v in gathered(w.value)}) == 1
    finally:
        keras.mixed_precision.set_global_policy("float32")


@check
def upstream_optimizer_does_not_average():
    import horovod.tensorflow.keras as hk

    opt = hk.DistributedOptimizer(keras.optimizers.SGD(1.0))
    assert isinstance(opt, keras.optimizers.SGD) and hasattr(opt, "_aggregate_gradients")
    w = one_step(opt, C)
    # Keras 3 never calls _aggregate_gradients: each rank applied its own gradient.
    np.testing.assert_allclose(w.numpy(), -C)
    assert len({float(v[0]) for v in gathered(w.value)}) == SIZE


def main():
    failed = 0
    for fn in CHECKS:
        try:
            fn()
            print(f"CHECK {fn.__name__} ok rank={RANK}", flush=True)
        except Exception:
            failed += 1
            print(f"CHECK {fn.__name__} FAIL rank={RANK}\n{traceback.format_exc()}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
