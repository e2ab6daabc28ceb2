"""`bench zero` (#41): its arithmetic, checks, table and plot (no process started)."""

import argparse

import pytest

from tfdist.bench import zero

MIB = 1 << 20


def test_expected_saving_is_the_state_the_most_loaded_worker_does_not_own():
    assert zero.expected_saving([4, 4, 4, 4], 4) == 12
    assert zero.expected_saving([10, 1, 1], 2) == 2  # worker 0 owns 10, worker 1 the rest


@pytest.mark.parametrize("kw, message", [
    ({"strategies": "ps"}, "--strategies takes multi_worker, shm, horovod. Received: 'ps'"),
    ({"workers": 1}, "-n >= 2"),
    ({"strategies": "shm,horovod", "venv": "/nonexistent"}, "needs the Horovod venv")])
def test_bad_flags_are_refused_before_anything_runs(kw, message):
    args = argparse.Namespace(**{"workers": 4, "strategies": "shm", **kw})
    with pytest.raises(SystemExit, match=message):
        zero.run(args)


def _result():
    row = {"strategy": "shm", "peak_bytes": [3000 * MIB] * 2,
           "sharded_peak_bytes": [1700 * MIB] * 2,
           "saved_bytes": [1300 * MIB] * 2, "saved_over_expected": 3.4, "step_s": 4.0,
           "sharded_step_s": 2.0, "step_ratio": 0.5}
    return {"model": "m", "workers": 2, "state_bytes": 514 * MIB,
            "expected_saving_bytes": 257 * MIB, "rows": [row, {**row, "strategy": "multi_worker"}],
            "goals": {"saved_over_expected": 0.8, "step_ratio": 1.1}}


def test_table_and_plot_show_every_strategy():
    from matplotlib.figure import Figure

    text = zero.table(_result())
    assert "shm" in text and "multi_worker" in text and "3.40" in text and "0.50" in text
    fig = Figure()
    zero.plot(_result(), fig)
    assert len(fig.axes) == 2
