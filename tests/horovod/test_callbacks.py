"""LR warmup values (pure and in a real fit), without Horovod (size given)."""

import numpy as np
import pytest

from tfdist.horovod.lr_callbacks import LearningRateWarmup, warmup_learning_rate


@pytest.mark.parametrize("epoch, expected", [
    (0.0, 0.1), (0.5, 0.1 * (1 + 3 * 0.25)), (1.0, 0.25), (2.0, 0.4), (5.0, 0.4)])
def test_warmup_goes_from_lr_to_lr_times_size(epoch, expected):
    assert warmup_learning_rate(0.1, 4, 2.0, epoch) == pytest.approx(expected)


def test_no_warmup_is_the_target_rate():
    assert warmup_learning_rate(0.1, 4, 0, 0.0) == pytest.approx(0.4)


def test_warmup_callback_sets_the_rate_every_batch_in_fit():
    import keras

    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(float(np.asarray(self.model.optimizer.learning_rate)))

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    x, y = np.ones((16, 3), "float32"), np.ones((16, 1), "float32")
    model.fit(x, y, batch_size=4, epochs=3, verbose=0,
              callbacks=[LearningRateWarmup(0.01, warmup_epochs=2, size=4), Record()])
    epochs = np.arange(12) / 4
    np.testing.assert_allclose(seen, [warmup_learning_rate(0.01, 4, 2, e) for e in epochs],
                               rtol=1e-6)
    assert seen[0] == pytest.approx(0.01) and seen[-1] == pytest.approx(0.04)


def test_negative_warmup_is_rejected():
    with pytest.raises(ValueError, match="warmup_epochs must be >= 0. Received: warmup_epochs=-1"):
        LearningRateWarmup(0.1, -1, size=2)
