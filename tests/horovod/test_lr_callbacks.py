"""The learning-rate callbacks in a real single-process fit (size given, no Horovod).

The schedule values are Horovod's (tests/workers/hvd_lr_schedule.py); the same
schedule on 2 real ranks is in tests/workers/hvd_keras_port.py.
"""

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from tests.workers import hvd_lr_schedule  # noqa: E402
from tests.workers.hvd_lr_schedule import RecordLR  # noqa: E402
from tfdist.horovod.lr_callbacks import (  # noqa: E402
    LearningRateScheduleCallback, LearningRateWarmup)


def _horovod_model(optimizer):
    return hvd_lr_schedule.horovod_model(optimizer)


def test_horovod_train_model_lr_schedule():
    """Port of Horovod's test_train_model_lr_schedule, with size 2 given."""
    keras.utils.set_random_seed(0)
    size, initial_lr = 2, 0.1 * 2
    model = _horovod_model(keras.optimizers.Adam())
    x, y = np.random.random((10, 3)), np.random.random((10, 3, 2))
    record, history = hvd_lr_schedule.fit_horovod_schedule(model, x, y, initial_lr, size)
    hvd_lr_schedule.horovod_assertions(record.epochs, initial_lr)
    np.testing.assert_allclose(record.epochs,
                               hvd_lr_schedule.expected_epoch_end_lrs(initial_lr, size),
                               rtol=1e-6)
    # The warmup starts one batch in (Horovod's shift) at initial_lr / size and
    # ends at exactly initial_lr; the schedule callbacks log the rate.
    assert record.batches[0] == pytest.approx(initial_lr / size * (1 + 1 / 25))
    assert record.batches[24] == pytest.approx(initial_lr)
    np.testing.assert_allclose(history.history["learning_rate"], record.epochs, rtol=1e-6)


def test_schedule_acts_only_inside_its_epochs_staircase_and_smooth():
    keras.utils.set_random_seed(0)
    x, y = np.ones((8, 3), "float32"), np.ones((8, 3, 2), "float32")
    stair, smooth = RecordLR(), RecordLR()
    for record, staircase in ((stair, True), (smooth, False)):
        model = _horovod_model(keras.optimizers.SGD(0.5))
        model.fit(x, y, batch_size=2, epochs=5, verbose=0, callbacks=[
            LearningRateScheduleCallback(1.0, multiplier=lambda e: 1 / (1 + e), start_epoch=1,
                                         end_epoch=3, staircase=staircase), record])
    epoch = np.arange(20) / 4
    inside = (epoch >= 1) & (epoch < 3)
    # Before the range: the optimizer's own rate; after it: the last value set.
    np.testing.assert_allclose(stair.batches, np.select(
        [epoch < 1, inside], [0.5, 1 / (1 + np.floor(epoch))], 1 / 3), rtol=1e-6)
    np.testing.assert_allclose(smooth.batches, np.select(
        [epoch < 1, inside], [0.5, 1 / (1 + epoch)], 1 / (1 + 2.75)), rtol=1e-6)


def test_constant_multiplier_is_horovods_exponential_decay():
    cb = LearningRateScheduleCallback(1.0, multiplier=0.5, start_epoch=2)
    assert [cb.multiplier(e) for e in (2, 3, 4)] == [1.0, 0.5, 0.25]


def _linear_momentum_run(momentum_correction):
    """SGD(momentum 0.9) on loss = w (gradient 1); the rate drops 1.0 -> 0.1 at epoch 1."""
    model = keras.Sequential([keras.Input((1,)),
                              keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    model.compile(optimizer=keras.optimizers.SGD(1.0, momentum=0.9),
                  loss=lambda y, p: keras.ops.mean(p))
    model.fit(np.ones((1, 1), "float32"), np.zeros((1, 1), "float32"), epochs=3, verbose=0,
              callbacks=[LearningRateScheduleCallback(
                  1.0, multiplier=lambda e: 0.1, start_epoch=1,
                  momentum_correction=momentum_correction)])
    return float(model.get_weights()[0][0, 0])


def test_momentum_correction_is_goyal_et_al():
    # v = m * v - lr * g. Epoch 0: v = -1. Epoch 1 (lr 0.1): with correction the
    # momentum is 0.9 * 0.1 for that step, v = -0.19; then v = 0.9 * v - 0.1 = -0.271.
    assert _linear_momentum_run(True) == pytest.approx(-1 - 0.19 - 0.271, rel=1e-6)
    # Without: v = 0.9 * -1 - 0.1 = -1.0 on both later steps.
    assert _linear_momentum_run(False) == pytest.approx(-3.0, rel=1e-6)


def test_warmup_hands_over_to_a_later_keras_schedule():
    """Warmup for 2 epochs, then Keras's LearningRateScheduler decays at epochs 3, 6 and 8."""
    keras.utils.set_random_seed(0)
    record = RecordLR()
    model = _horovod_model(keras.optimizers.SGD(0.04))
    decay = keras.callbacks.LearningRateScheduler(
        lambda epoch, lr: 0.04 * 0.1 ** sum(epoch >= e for e in (3, 6, 8)))
    model.fit(np.ones((8, 3), "float32"), np.ones((8, 3, 2), "float32"), batch_size=2,
              epochs=10, verbose=0,
              callbacks=[LearningRateWarmup(0.01, warmup_epochs=2, size=4), decay, record])
    epoch = np.arange(40) / 4
    expected = np.where(epoch < 2, 0.01 * (1 + 3 * epoch / 2),
                        0.04 * 0.1 ** np.searchsorted([3, 6, 8], epoch, side="right"))
    np.testing.assert_allclose(record.batches, expected, rtol=1e-6)


def test_warmup_leaves_a_run_resumed_past_it_alone():
    record = RecordLR()
    model = _horovod_model(keras.optimizers.SGD(0.123))
    model.fit(np.ones((4, 3), "float32"), np.ones((4, 3, 2), "float32"), batch_size=2,
              epochs=4, initial_epoch=2, verbose=0,
              callbacks=[LearningRateWarmup(0.01, warmup_epochs=2, size=4), record])
    np.testing.assert_allclose(record.batches, 0.123, rtol=1e-6)


def test_schedule_needs_initial_lr():
    with pytest.raises(ValueError, match="needs initial_lr. Received: initial_lr=None"):
        LearningRateScheduleCallback(None, multiplier=0.1)
