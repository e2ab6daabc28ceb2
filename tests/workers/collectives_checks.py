"""Test worker: tfdist.collectives and the callbacks written once on them, on real ranks.

    python collectives_checks.py shm RANK SIZE PORT        # the shared-memory engine
    horovodrun -np 2 -H localhost:2 --gloo python collectives_checks.py horovod
    python collectives_checks.py shm-die RANK SIZE PORT    # rank SIZE-1 exits after joining
    python -m tfdist.launch -n 2 -- python collectives_checks.py mwms  # MultiWorkerMirrored

Each check runs on every rank against values it can compute by hand (rank r
holds r + 1) and prints `CHECK <name> ok rank=<r>` or `CHECK <name> FAIL`
with the reason. `shm-die` prints `LOST rank=<r> address=<a>` from the
structured error the survivors get.
"""

import os
import sys
import time
import traceback

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ENGINE = sys.argv[1]
if ENGINE.startswith("shm"):
    from tfdist.shm import runtime

    runtime.init(int(sys.argv[2]), int(sys.argv[3]), ("127.0.0.1", int(sys.argv[4])),
                 timeout_s=30)
    from tfdist.shm.collectives import ShmCollectives as Engine
elif ENGINE == "mwms":
    import tensorflow as tf

    from tfdist.collectives.mwms import MWMSCollectives

    STRATEGY = tf.distribute.MultiWorkerMirroredStrategy()  # from tfdist.launch's TF_CONFIG

    def Engine():  # noqa: N802 - stands in for the engine classes
        return MWMSCollectives(STRATEGY)
else:
    from tfdist.horovod.collectives import HorovodCollectives as Engine

COLL = Engine()
RANK, SIZE = COLL.rank, COLL.size
C = float(RANK + 1)
MEAN = sum(r + 1.0 for r in range(SIZE)) / SIZE
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


# What MultiWorkerMirrored needs of its host collectives: agreement, a mean, a barrier
# (it keeps variables and metrics in step itself, so no callbacks), and a broadcast of
# what one task holds alone (its rows at --shard parameters).
MWMS_CHECKS = ("average", "any_and_all_agreement", "barrier_waits_for_the_last_rank",
               "broadcast_carries_the_roots_values", "all_to_all_sends_row_q_to_rank_q",
               "reduce_scatter_has_no_cpu_implementation")


@check
def all_to_all_sends_row_q_to_rank_q():
    # tfdist.compat.tf_all_to_all: what --shard-optimizer-state's reduce-scatter stands on.
    if ENGINE != "mwms":
        return
    import tensorflow as tf

    from tfdist.compat import tf_all_to_all

    mine = tf.constant([[100.0 * RANK + q, -q] for q in range(SIZE)])

    @tf.function
    def step(x):
        return STRATEGY.run(tf_all_to_all.all_to_all, args=(x,))

    got = step(STRATEGY.experimental_distribute_values_from_function(lambda _: mine))
    want = [[100.0 * p + RANK, -RANK] for p in range(SIZE)]
    np.testing.assert_array_equal(STRATEGY.experimental_local_results(got)[0].numpy(), want)


@check
def reduce_scatter_has_no_cpu_implementation():
    # The upstream gap tfdist.compat.tf_all_to_all works around (last: it aborts the
    # collective executor, so no collective may follow).
    if ENGINE != "mwms":
        return
    import tensorflow as tf
    from tensorflow.python.ops import gen_collective_ops

    launcher = STRATEGY.extended._cross_device_ops._launchers[0]

    @tf.function
    def step(x):
        return gen_collective_ops.collective_reduce_scatter_v2(
            x, launcher._group_size, launcher._group_key, launcher._next_instance_key(),
            [launcher._get_ordering_token()], merge_op="Add", final_op="Id",
            communication_hint="auto", timeout_seconds=30)

    try:
        step(tf.ones([2 * SIZE]))
    except tf.errors.InternalError as e:
        assert "did not find collective implementation" in str(e), e
    else:
        raise AssertionError("CollectiveReduceScatterV2 ran on CPU: tfdist.zero.scatter "
                             "could use it")


@check
def broadcast_carries_the_roots_values():
    # Each rank's own values, different everywhere: float32 of several pieces (1 Mi
    # elements each, the last padded, the first -0.0), an int64 index, an empty array and
    # float64, from every root in turn, bit for bit.
    for root in range(SIZE):
        mine = [np.arange((1 << 20) + 5, dtype=np.float32) * -(RANK + 1.5),
                np.array([7 + RANK], np.int64), np.zeros((0, 3), np.float32),
                np.full((2, 3), RANK - 0.25, np.float64)]
        got = COLL.broadcast(mine, root)
        want = [np.arange((1 << 20) + 5, dtype=np.float32) * -(root + 1.5),
                np.array([7 + root], np.int64), np.zeros((0, 3), np.float32),
                np.full((2, 3), root - 0.25, np.float64)]
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.shape)
            assert g.tobytes() == w.tobytes(), (root, g[:4], w[:4])


def callbacks():
    if ENGINE == "shm":
        from tfdist.shm import callbacks as cbs
    else:
        from tfdist.horovod import callbacks as cbs
    return cbs


@check
def broadcast():
    root = SIZE - 1
    mine = [np.full((3, 2), C, np.float32), np.array([RANK, -RANK], np.int64),
            np.arange(4, dtype=np.uint8) + RANK, np.array([2**32 - 1 - RANK], np.uint32),
            np.array(C)]
    got = COLL.broadcast(mine, root)
    want = [np.full((3, 2), SIZE, np.float32), np.array([root, -root], np.int64),
            np.arange(4, dtype=np.uint8) + root, np.array([2**32 - 1 - root], np.uint32),
            np.array(float(SIZE))]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g, w)
        np.testing.assert_array_equal(g, w)


@check
def average():
    (got,) = COLL.average([np.array([C, 10.0 * RANK])])
    np.testing.assert_allclose(got, [MEAN, 10.0 * (SIZE - 1) / 2])


@check
def any_and_all_agreement():
    last = RANK == SIZE - 1
    assert COLL.any_true(last) is True and COLL.all_true(last) is False
    assert COLL.any_true(False) is False and COLL.all_true(True) is True


@check
def barrier_waits_for_the_last_rank():
    if RANK == SIZE - 1:
        time.sleep(1.0)
    start = time.monotonic()
    COLL.barrier()
    waited = time.monotonic() - start
    assert RANK == SIZE - 1 or waited > 0.5, waited  # it slept 1 s before arriving


@check
def broadcast_initial_state_callback():
    import keras

    from tfdist.collectives import keras_callbacks

    keras.utils.set_random_seed(100 + RANK)  # every rank starts elsewhere
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    cbs = callbacks()
    cb = cbs.BroadcastInitialState(0) if ENGINE == "shm" else cbs.BroadcastInitialState(root_rank=0)
    cb.set_model(model)
    limit, keras_callbacks.BROADCAST_GROUP_BYTES = keras_callbacks.BROADCAST_GROUP_BYTES, 16
    try:  # a broadcast per variable: every rank's groups pair up
        cb.on_train_begin()
    finally:
        keras_callbacks.BROADCAST_GROUP_BYTES = limit
    assert model.optimizer.built  # its slots were built and broadcast too
    mine = [np.asarray(v.numpy()) for v in keras_callbacks.state_variables(model, None)]
    for value, root_value in zip(mine, COLL.broadcast(mine, 0)):
        np.testing.assert_array_equal(value, root_value)


@check
def metric_average_callback():
    logs = {"loss": C, "accuracy": 10.0 * RANK, "name": "not a number"}
    callbacks().MetricAverage().on_epoch_end(0, logs)
    assert logs["loss"] == MEAN and logs["accuracy"] == 10.0 * (SIZE - 1) / 2, logs
    assert logs["name"] == "not a number"


@check
def metric_average_refuses_different_names_on_every_rank():
    from tfdist.errors import CollectiveMismatchError

    logs = {"loss": C, **({"extra_metric": 1.0} if RANK == SIZE - 1 else {})}
    try:
        callbacks().MetricAverage().on_epoch_end(3, logs)
    except CollectiveMismatchError as e:
        assert "end of epoch 3 differ across ranks" in str(e), e
        assert ("another rank has different ones" in str(e) if RANK == 0
                else "extra_metric" in str(e)), e
    else:
        raise AssertionError("no error")
    assert logs["loss"] == C  # nothing averaged
    assert COLL.any_true(RANK == 0) is True  # and the ranks are still in step


def main():
    if ENGINE == "shm-die":
        if RANK == SIZE - 1:
            os._exit(0)  # joined, then gone
        try:
            COLL.any_true(False)
        except Exception as e:  # noqa: BLE001 - printed for the test
            lost = COLL.lost_peer(RuntimeError("a TensorFlow error whose text names nobody"))
            print(f"RAISED {type(e).__name__} rank={getattr(e, 'rank', None)}", flush=True)
            print(f"LOST rank={lost.rank} address={lost.address}", flush=True)
            os._exit(0)
        print("no error", flush=True)
        os._exit(1)
    failed = False
    by_name = {c.__name__: c for c in CHECKS}
    for fn in ([by_name[n] for n in MWMS_CHECKS] if ENGINE == "mwms" else CHECKS):
        try:
            fn()
            print(f"CHECK {fn.__name__} ok rank={RANK}", flush=True)
        except Exception:  # noqa: BLE001 - reported per check
            failed = True
            print(f"CHECK {fn.__name__} FAIL rank={RANK}\n{traceback.format_exc()}", flush=True)
    sys.stdout.flush()
    if ENGINE == "mwms":
        # TensorFlow's own teardown, as the trainer exits: os._exit by one worker while the
        # other still shuts down its collective executor aborts that one ("Socket closed").
        sys.exit(1 if failed else 0)
    os._exit(1 if failed else 0)


if __name__ == "__main__":
    main()
