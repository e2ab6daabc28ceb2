"""Test worker: Horovod's own Keras tests, ported to Keras 3, and issue 15's scenarios.

    horovodrun -np 2 -H localhost:2 --gloo python tests/workers/hvd_keras_port.py [CHECK ...]

Ported from horovod's test/parallel/test_tensorflow2_keras.py and
test_tensorflow_keras.py (what applies to Keras 3; their expected numbers
kept, `hvd_*` checks), plus the scenarios where ranks name their optimizers
differently (`names_*`, `load_*`, `from_config_*`): each ends with the weights
of one replica trained on the global batch, computed in the same process.
With no arguments every check runs, otherwise the named ones. Each prints
`CHECK <name> ok rank=<r>` or `CHECK <name> FAIL rank=<r>` and a traceback.
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
from tfdist.horovod import runtime  # noqa: E402

import hvd_lr_schedule  # noqa: E402  (beside this file)

hvd = runtime.hvd()
RANK, SIZE = hvd.rank(), hvd.size()
RTOL, ATOL = 1e-5, 1e-6
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def gathered(x):
    """Every rank's value of x, flattened and stacked in rank order."""
    return hvd.allgather(tf.reshape(tf.convert_to_tensor(x), [1, -1])).numpy()


def same_on_every_rank(weights):
    for w in weights:
        rows = gathered(w)
        assert all(np.array_equal(rows[0], r) for r in rows[1:]), rows


def assert_close(a_weights, b_weights):
    assert len(a_weights) == len(b_weights)
    for a, b in zip(a_weights, b_weights):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def make_other_optimizers_and_models(n):
    """What a script may do before training (an evaluation model, a tuner):
    each bumps Keras's per-process names (sgd_1, dense_3, ...)."""
    for _ in range(n):
        keras.optimizers.SGD(0.1, momentum=0.9)
        keras.optimizers.Adam()
        keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])


# Issue 15: ranks whose optimizers have different Keras names, equal to one replica.

GLOBAL_BATCH = 16
DATA = np.random.RandomState(0)
X = DATA.random_sample((64, 3)).astype("float32")
Y = DATA.random_sample((64, 3, 3)).astype("float32")


def shard(a):
    """This rank's half of every global batch (consecutive, equal slices)."""
    local = GLOBAL_BATCH // SIZE
    batches = a.reshape(-1, GLOBAL_BATCH, *a.shape[1:])
    return batches[:, RANK * local:(RANK + 1) * local].reshape(-1, *a.shape[1:])


def create_model(seed, optimizer):
    """Horovod's test_load_model_broadcast model (Keras 3 spelling)."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2),
                              keras.layers.RepeatVector(3),
                              keras.layers.TimeDistributed(keras.layers.Dense(3))])
    model.compile(loss="mse", optimizer=optimizer)
    return model


def sgd():
    return keras.optimizers.SGD(0.01 * SIZE, momentum=0.9)


def fit_shard(model, epochs, initial_epoch=0):
    model.fit(shard(X), shard(Y), batch_size=GLOBAL_BATCH // SIZE, epochs=epochs,
              initial_epoch=initial_epoch, shuffle=False, verbose=0,
              callbacks=[thvd.BroadcastInitialState(0)])


def single_replica(seed, epochs):
    """One replica's weights after `epochs` on the global batch; checks that training moved them."""
    model = create_model(seed, sgd())
    initial = model.get_weights()
    model.fit(X, Y, batch_size=GLOBAL_BATCH, epochs=epochs, shuffle=False, verbose=0)
    assert not np.allclose(initial[0], model.get_weights()[0])
    return model.get_weights()


@check
def names_differ_across_ranks():
    # Rank 0 made 3 more optimizers and models first: its SGD is `sgd_<n+3>`.
    make_other_optimizers_and_models(3 if RANK == 0 else 0)
    opt = thvd.DistributedOptimizer(sgd())
    names = hvd.allgather_object(opt.name)
    assert len(set(names)) == SIZE, names
    model = create_model(100 + RANK, opt)
    initial = model.get_weights()
    assert len({float(v[0]) for v in gathered(initial[0])}) == SIZE  # they start apart
    fit_shard(model, epochs=2)
    assert_close(model.get_weights(), single_replica(100, epochs=2))


@check
def load_then_broadcast():
    """Horovod's test_load_model_broadcast, then issue 15's: rank 0 loads a model
    saved with a wrapped optimizer after making other optimizers, the others
    build a fresh one; after the broadcast and one more epoch every rank has
    one replica's weights after 2 epochs."""
    model = create_model(7 + RANK, thvd.DistributedOptimizer(sgd()))
    fit_shard(model, epochs=1)
    path = os.path.join(tempfile.mkdtemp(), "model.keras") if RANK == 0 else None
    if RANK == 0:
        model.save(path)
    path = hvd.broadcast_object(path, 0)  # also a barrier: the file exists now
    if RANK == 0:
        make_other_optimizers_and_models(2)
        model = thvd.load_model(path)
        assert model.optimizer.built and len(model.optimizer.variables) == 6
    else:
        model = create_model(999, thvd.DistributedOptimizer(sgd()))
        assert not model.optimizer.built
    names = hvd.allgather_object(model.optimizer.name)
    assert len(set(names)) == SIZE, names
    fit_shard(model, epochs=2, initial_epoch=1)
    # iterations, learning rate and 4 momenta (Horovod's Keras 2 count was 5).
    assert len(model.optimizer.variables) == 6
    assert int(model.optimizer.iterations) == 2 * len(X) // GLOBAL_BATCH
    assert_close(model.get_weights(), single_replica(7, epochs=2))


@check
def from_config_copy_trains_like_one_replica():
    """Horovod's test_from_config, then the copy trains (issue 15)."""
    hopt = thvd.DistributedOptimizer(keras.optimizers.Adam())
    cfg = hopt.get_config()
    assert hopt.from_config(cfg).get_config() == cfg
    assert hopt.__class__.from_config(cfg).get_config() == cfg
    opt = thvd.DistributedOptimizer(sgd())
    copy = type(opt).from_config(opt.get_config())
    model = create_model(300 + RANK, copy)
    fit_shard(model, epochs=2)
    assert_close(model.get_weights(), single_replica(300, epochs=2))


# Ported from horovod test/parallel/test_tensorflow2_keras.py.

@check
def hvd_train_model_lr_schedule():
    """test_train_model_lr_schedule: warmup 5 epochs, then x0.1, x0.01, x epoch."""
    initial_lr = 0.1 * SIZE
    model = hvd_lr_schedule.horovod_model(thvd.DistributedOptimizer(keras.optimizers.Adam()))
    data = np.random.RandomState(RANK)  # Horovod: each rank its own random data
    x, y = data.random_sample((10, 3)), data.random_sample((10, 3, 2))
    record, history = hvd_lr_schedule.fit_horovod_schedule(
        model, x, y, initial_lr, callbacks=[thvd.BroadcastInitialState(0), thvd.MetricAverage()])
    hvd_lr_schedule.horovod_assertions(record.epochs, initial_lr)
    np.testing.assert_allclose(record.epochs,
                               hvd_lr_schedule.expected_epoch_end_lrs(initial_lr, SIZE),
                               rtol=1e-6)
    same_on_every_rank([np.array(record.epochs)])
    # "test that the metrics average is being respected"
    loss = np.array(history.history["loss"], "float32")
    np.testing.assert_allclose(hvd.broadcast(tf.constant(loss), 0).numpy(), loss)


def _embedding_model(optimizer):
    keras.utils.set_random_seed(RANK)
    model = keras.Sequential([keras.Input((10,), dtype="int32"),
                              keras.layers.Embedding(1000, 64)])
    model.compile(loss="mse", optimizer=optimizer)
    thvd.broadcast_state(model)
    return model


def _embedding_batch():
    data = np.random.RandomState(10 + RANK)
    return data.randint(1000, size=(32, 10)), data.random_sample((32, 10, 64))


@check
def hvd_sparse_as_dense():
    model = _embedding_model(thvd.DistributedOptimizer(keras.optimizers.RMSprop(0.0001),
                                                       sparse_as_dense=True))
    before = model.get_weights()[0]
    model.train_on_batch(*_embedding_batch())
    assert not np.allclose(model.get_weights()[0], before)
    same_on_every_rank(model.get_weights())


@check
def hvd_sparse_as_dense_with_grad_aggregation():
    backward_passes_per_step = 2
    opt = thvd.DistributedOptimizer(keras.optimizers.RMSprop(0.0001), sparse_as_dense=True,
                                    backward_passes_per_step=backward_passes_per_step)
    model = _embedding_model(opt)
    training_steps = 3
    for _ in range(training_steps):
        model.train_on_batch(*_embedding_batch())
    # Horovod's aggregation counter: Keras 3 counts passes in `_iterations`
    # (its public `iterations` counts updates: passes // k).
    assert int(opt._iterations) % backward_passes_per_step == \
        training_steps % backward_passes_per_step
    assert int(opt.iterations) == training_steps // backward_passes_per_step
    same_on_every_rank(model.get_weights())


@check
def hvd_grad_aggregation_with_inf_grad():
    backward_passes_per_step = 2
    opt = thvd.DistributedOptimizer(keras.optimizers.SGD(), sparse_as_dense=True,
                                    backward_passes_per_step=backward_passes_per_step)
    x = keras.Variable(0.0)
    step_count = 0
    grads = None
    for _ in range(2 * backward_passes_per_step):
        step_count += 1
        with tf.GradientTape() as tape:
            loss = x.value if step_count > 1 else x.value * float("inf")
        grads = tape.gradient(loss, [x.value])
        opt.apply_gradients(zip(grads, [x]))
        if step_count == backward_passes_per_step:
            assert not np.isfinite(x.numpy())  # the first cycle's gradient was infinite
            x.assign(0.0)
    assert tf.math.is_finite(grads[0])
    # The second cycle saw none of the first's infinity: x = -lr * mean(1, 1).
    np.testing.assert_allclose(x.numpy(), -0.01, rtol=1e-6)


class TestingOptimizer(keras.optimizers.Optimizer):
    """Horovod's: adds the gradient to the variable."""

    def __init__(self, name="test", learning_rate=0.1, **kwargs):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)

    def update_step(self, gradient, variable, learning_rate):
        self.assign_add(variable, gradient)


def _gradient_aggregation(average_aggregated_gradients):
    backward_passes_per_step = 4
    hvd_optimizer = thvd.DistributedOptimizer(
        TestingOptimizer("test"), backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, sparse_as_dense=True)
    x_0, y_0, y_1 = 0.0, 1.0, 2.0
    x = keras.Variable([x_0])
    y = keras.Variable([y_0, y_1])
    variables = [x, y]

    @tf.function
    def compute_and_apply_gradients():
        with tf.GradientTape() as tape:
            # loss = x - y * e1; tf.gather makes y's gradient IndexedSlices.
            loss = x.value - tf.gather(y.value, [0])
        grads = tape.gradient(loss, [x.value, y.value])
        hvd_optimizer.apply_gradients(zip(grads, variables))

    total_num_of_steps = 10
    for idx in range(total_num_of_steps):
        compute_and_apply_gradients()
        num_of_steps = (idx + 1) // backward_passes_per_step
        gradient_of_x, gradient_of_y_0 = num_of_steps * 1.0, num_of_steps * -1.0
        if not average_aggregated_gradients:
            gradient_of_x *= backward_passes_per_step
            gradient_of_y_0 *= backward_passes_per_step
        assert np.isclose(x.numpy(), x_0 + gradient_of_x)
        assert np.isclose(y.numpy(), [y_0 + gradient_of_y_0, y_1]).all()
        # Horovod: iterations == passes; Keras 3: `_iterations` counts passes,
        # `iterations` updates.
        assert idx + 1 == int(hvd_optimizer._iterations)
        assert num_of_steps == int(hvd_optimizer.iterations)
    assert int(hvd_optimizer._iterations) % backward_passes_per_step == \
        total_num_of_steps % backward_passes_per_step


@check
def hvd_gradient_aggregation_average():
    _gradient_aggregation(True)


@check
def hvd_gradient_aggregation_sum():
    _gradient_aggregation(False)


# Ported from horovod test/parallel/test_tensorflow_keras.py (its TF1 tests).

@check
def hvd_gradient_aggregation_rank_gradients():
    """test_gradient_aggregation: each rank's gradient is its rank, averaged twice."""
    backward_passes_per_step = 4
    hvd_optimizer = thvd.DistributedOptimizer(
        TestingOptimizer("test"), backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=True)

    def compute_expected_value(batch_id):
        sum_per_aggregation = 0.0
        for _ in range(backward_passes_per_step):
            grads_for_batch = 0.0
            for rank in range(SIZE):
                grads_for_batch += rank
            grads_for_batch /= float(backward_passes_per_step)
            sum_per_aggregation += grads_for_batch / float(SIZE)
        aggregations_completed = (batch_id + 1) // backward_passes_per_step
        return aggregations_completed * sum_per_aggregation

    variables = [keras.Variable([0.0])]
    for idx in range(10):
        hvd_optimizer.apply_gradients([(tf.constant([float(RANK)]), variables[0])])
        assert idx + 1 == int(hvd_optimizer._iterations)  # passes (see above)
        assert variables[0].numpy()[0] == compute_expected_value(idx)


def _train_model(backward_passes_per_step):
    """train_model: RMSprop, Horovod's model, a generator of one example."""
    opt = thvd.DistributedOptimizer(keras.optimizers.RMSprop(0.0001),
                                    backward_passes_per_step=backward_passes_per_step)
    keras.utils.set_random_seed(RANK)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2),
                              keras.layers.RepeatVector(3), keras.layers.ReLU(threshold=0.5)])
    model.compile(loss="mse", optimizer=opt, metrics=["categorical_accuracy"])
    data = np.random.RandomState(20 + RANK)
    x, y = data.random_sample((1, 3)), data.random_sample((1, 3, 2))

    def generator():
        while True:
            yield x, y

    dataset = tf.data.Dataset.from_generator(generator, output_signature=(
        tf.TensorSpec((1, 3), tf.float64), tf.TensorSpec((1, 3, 2), tf.float64)))
    model.fit(dataset, steps_per_epoch=10, epochs=1, verbose=0,
              callbacks=[thvd.BroadcastInitialState(0)])
    same_on_every_rank(model.get_weights())


@check
def hvd_train_model():
    _train_model(1)


@check
def hvd_train_model_with_gradient_aggregation():
    _train_model(2)


class TestOptimizer(keras.optimizers.RMSprop):
    pass


@check
def hvd_load_model_custom_optimizers_and_objects():
    """test_load_model, _custom_optimizers, _custom_objects: then the copy trains."""
    data = np.random.RandomState(30 + RANK)
    x, y = data.random_sample((1, 3)), data.random_sample((1, 3, 3))
    for cls, kwargs in ((keras.optimizers.RMSprop, {}),
                        (TestOptimizer, {"custom_optimizers": [TestOptimizer]}),
                        (TestOptimizer, {"custom_objects": {"TestOptimizer": TestOptimizer}})):
        opt = thvd.DistributedOptimizer(cls(learning_rate=0.0001))
        model = create_model(40, opt)
        model.train_on_batch(x, y)
        fname = os.path.join(tempfile.mkdtemp(), "m.keras")
        model.save(fname)
        new_model = thvd.load_model(fname, **kwargs)
        new_opt = new_model.optimizer
        assert type(new_opt).__name__ == cls.__name__ and new_opt._tfdist_distributed
        assert float(new_opt.learning_rate) == float(opt.learning_rate)
        assert len(opt.variables) == len(new_opt.variables)
        for w, new_w in zip(opt.variables, new_opt.variables):
            assert np.array_equal(w.numpy(), new_w.numpy())
        new_model.train_on_batch(x, y)  # rank-own data: the allreduce evens it
        same_on_every_rank(new_model.get_weights())


def main():
    wanted = set(sys.argv[1:])
    unknown = wanted - {fn.__name__ for fn in CHECKS}
    if unknown:
        print(f"unknown checks: {sorted(unknown)}", flush=True)
        return 2
    failed = 0
    for fn in CHECKS:
        if wanted and fn.__name__ not in wanted:
            continue
        try:
            fn()
            print(f"CHECK {fn.__name__} ok rank={RANK}", flush=True)
        except Exception:
            failed += 1
            print(f"CHECK {fn.__name__} FAIL rank={RANK}\n{traceback.format_exc()}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
