"""Keras 3 applies repeated sparse-gradient rows separately; tfdist sums them first.

In process, one optimizer step on a variable whose row 1 is looked up twice
(an IndexedSlices with index 1 twice), against the same step on the dense
gradient. Keras as released differs for stateful optimizers; with the
workaround every optimizer takes the dense step.
"""

import numpy as np
import pytest

from tfdist.compat import keras_sparse_duplicates

STATEFUL = ("adam", "rmsprop", "adagrad")


def _step(name, sparse):
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    var = keras.Variable(np.ones((4, 2), np.float32))
    grad = tf.IndexedSlices(tf.constant([[1.0, 2.0], [3.0, 4.0]]), tf.constant([1, 1]),
                            dense_shape=tf.constant([4, 2]))
    opt = keras.optimizers.get(name)
    opt.apply([grad if sparse else tf.convert_to_tensor(grad)], [var])
    return var.numpy()


def _gap(name):
    return float(np.abs(_step(name, True) - _step(name, False)).max())


@pytest.fixture
def upstream():
    was = keras_sparse_duplicates._state["applied"]
    keras_sparse_duplicates.revert()
    yield
    if was:
        keras_sparse_duplicates.apply()


@pytest.fixture
def patched():
    was = keras_sparse_duplicates._state["applied"]
    keras_sparse_duplicates.apply()
    yield
    if not was:
        keras_sparse_duplicates.revert()


@pytest.mark.parametrize("name", STATEFUL)
def test_keras_applies_repeated_rows_separately(upstream, name):
    assert _gap(name) > 1e-4  # sum of squares, not square of the sum


@pytest.mark.parametrize("name", ("sgd",) + STATEFUL)
def test_workaround_takes_the_dense_step(patched, name):
    assert _gap(name) < 1e-6


def test_deduplicate_sums_repeated_indices_in_first_seen_order():
    import tensorflow as tf

    g = tf.IndexedSlices(tf.constant([[1.0], [2.0], [4.0]]), tf.constant([3, 0, 3]),
                         dense_shape=tf.constant([5, 1]))
    out = keras_sparse_duplicates.deduplicate(g)
    assert out.indices.numpy().tolist() == [3, 0]
    assert out.values.numpy().ravel().tolist() == [5.0, 2.0]
    np.testing.assert_array_equal(tf.convert_to_tensor(out), tf.convert_to_tensor(g))
    dense = tf.ones((2, 2))
    assert keras_sparse_duplicates.deduplicate(dense) is dense
    assert keras_sparse_duplicates.deduplicate(None) is None
