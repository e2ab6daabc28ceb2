"""tfdist.parameters.count: the one parameter count, and the four places that use it."""

from __future__ import annotations

import types

import numpy as np

from tfdist import parameters


def _var(*shape):
    return types.SimpleNamespace(shape=shape)


def test_count_sums_each_variables_elements():
    assert parameters.count([_var(3, 4), _var(4), _var()]) == 12 + 4 + 1
    assert parameters.count([]) == 0
    assert parameters.count([np.zeros((2, 3, 5), np.float16)]) == 30
    assert type(parameters.count([_var(np.int64(7), 2)])) is int


def test_the_graph_the_placement_table_and_the_backup_size_agree_with_keras():
    import keras

    from tfdist import model_dir
    from tfdist.model_parallel import placement
    from tfdist.model_parallel.graph import from_keras

    x = keras.Input((5,))
    shared = keras.layers.Dense(5)
    h = shared(shared(x))
    out = keras.layers.Dense(3)(keras.layers.BatchNormalization()(h))
    model = keras.Model(x, out)
    expected = model.count_params()  # Keras's own count, trainable and not

    assert parameters.count(model.weights) == expected
    assert sum(n.params for n in from_keras(model).nodes) == expected
    assert sum(row[2] for row in placement.placement_rows(model.layers)) == expected
    assert model_dir.backup_bytes(model.weights) == (
        4 * expected + 512 * len(model.weights) + 64 * 1024)


def test_bench_model_stats_counts_trainable_parameters():
    from tfdist.bench.model_stats import model_stats

    stats = model_stats("wide_mlp")
    assert stats["params"] == 4_731_914  # the figure docs/benchmarks.md quotes
    assert stats["grad_bytes"] == 4 * stats["params"]
