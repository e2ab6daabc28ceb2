"""The initial-state broadcast of one-replica-per-process engines, a group at a time
(`tfdist.collectives.keras_callbacks`; no process started)."""

import numpy as np

from tfdist.collectives import keras_callbacks


def test_byte_groups_are_consecutive_and_bounded_unless_one_item_is_larger():
    groups = keras_callbacks.byte_groups([40, 30, 30, 100, 10, 10], 70)
    assert [list(g) for g in groups] == [[0, 1], [2], [3], [4, 5]]
    assert keras_callbacks.byte_groups([], 70) == []
    assert [list(g) for g in keras_callbacks.byte_groups([5, 5], 100)] == [[0, 1]]


class _Root:
    """Collectives whose root holds `values`: records each broadcast's bytes."""

    rank = 1

    def __init__(self, values):
        self.values, self.calls = list(values), []

    def broadcast(self, arrays, root=0):
        self.calls.append(sum(a.nbytes for a in arrays))
        return [self.values.pop(0) for _ in arrays]


def test_the_state_goes_a_bounded_group_at_a_time_and_every_variable_is_set(monkeypatch):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64),
                              keras.layers.Dense(64), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.Adam(0.1), loss="mse")
    variables = keras_callbacks.state_variables(model, None)
    root = [np.full(v.shape, i + 1.0, v.dtype) for i, v in enumerate(variables)]
    engine = _Root(root)
    monkeypatch.setattr(keras_callbacks, "BROADCAST_GROUP_BYTES", 64 * 64 * 4)  # a kernel
    keras_callbacks.broadcast_state(model, None, engine)
    assert max(engine.calls) <= 64 * 64 * 4 and len(engine.calls) > 3, engine.calls
    assert sum(engine.calls) == sum(keras_callbacks.nbytes(v) for v in variables)
    for i, v in enumerate(variables):  # Adam's slots too, each its root's value
        np.testing.assert_array_equal(np.asarray(v.numpy()), root[i])
