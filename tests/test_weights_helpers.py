"""The shared helpers that read trained weights back (tests/weights.py)."""

import numpy as np

from tests.weights import dump_dir_weights, dump_weights, ulp_nudged


def test_dump_weights_are_in_numeric_order_and_skip_other_keys():
    d = {f"w{i}": np.full(1, i) for i in (10, 2, 0, 1)}
    d.update(hostname="h0", wx=np.zeros(1), init0=np.ones(1))
    assert [int(a[0]) for a in dump_weights(d)] == [0, 1, 2, 10]
    assert [float(a[0]) for a in dump_weights(d, "init")] == [1.0]


def test_dump_dir_weights_read_every_worker_in_name_order(tmp_path):
    for worker, value in (("worker1", 1.0), ("worker0", 0.0)):
        np.savez(tmp_path / f"{worker}.npz", w0=np.full(2, value), w1=np.full(1, value))
    got = dump_dir_weights(str(tmp_path))
    assert [[float(a[0]) for a in w] for w in got] == [[0.0, 0.0], [1.0, 1.0]]


def test_ulp_nudged_moves_every_element_by_exactly_one_ulp():
    w = np.linspace(-1, 1, 101, dtype=np.float32).reshape(101, 1)
    (moved,) = ulp_nudged([w], np.random.default_rng(0))
    assert moved.dtype == np.float32
    steps = np.abs(moved - w) / np.spacing(np.abs(w))
    assert np.all((steps > 0.49) & (steps <= 1.0))  # one ulp (half of it below a power of 2)
    assert 0 < np.sum(moved > w) < w.size  # both directions drawn
