"""`bench zero` (#41): its arithmetic, checks, table and plot (no process started)."""

import argparse

import pytest

from tfdist.bench import zero

MIB = 1 << 20


def test_expected_saving_is_the_state_the_most_loaded_worker_does_not_own():
    assert zero.expected_saving([4, 4, 4, 4], 4) == 12
    assert zero.expected_saving([10, 1, 1], 2) == 2  # worker 0 owns 10, worker 1 the rest
    # At "gradients" one copy of the unowned gradients goes too (Adam: state = 2 x weights).
    assert zero.expected_saving([8, 8, 8, 8], 4, [4, 4, 4, 4]) == 36
    assert zero.expected_saving([20, 2, 2], 2, [10, 1, 1]) == 6


def test_parameters_bound_is_a_share_of_the_state_two_layers_and_the_baseline():
    # 4 workers, 10 bytes of state: ceil(10 / 4) = 3, two layers of 5, a baseline of 7.
    assert zero.parameters_bound(10, 5, 7, 4) == 3 + 10 + 7
    assert zero.parameters_bound(8, 0, 0, 2) == 4


def test_the_baseline_job_is_the_model_at_8_hidden_units():
    assert zero.baseline_model("model_parallel_mlp --hidden-units 4096 --optimizer adam") == \
        "model_parallel_mlp --hidden-units 8 --optimizer adam"
    assert zero.baseline_model("digits_mlp --optimizer adam") is None


def test_parameters_saving_is_all_but_each_padded_share_of_rows():
    # 8 rows on 4 workers: 2 each, 3/4 of state, gradient and weight saved.
    assert zero.parameters_saving([16], [8], [8], 4) == 24
    # 5 rows on 4 workers: 2 each (padded), so 3/5 of them saved; 1 row: none saved.
    assert zero.parameters_saving([10, 4], [5, 2], [5, 1], 4) == 12


@pytest.mark.parametrize("kw, message", [
    ({"strategies": "ps"}, "--strategies takes multi_worker, shm, horovod. Received: 'ps'"),
    ({"workers": 1}, "-n >= 2"),
    ({"levels": "optimizer,gradients"}, "--levels takes none first"),
    ({"levels": "none,parameterz"}, "Received: 'none,parameterz'"),
    ({"strategies": "shm,horovod", "venv": "/nonexistent"}, "needs the Horovod venv")])
def test_bad_flags_are_refused_before_anything_runs(kw, message):
    args = argparse.Namespace(**{"workers": 4, "strategies": "shm", **kw})
    with pytest.raises(SystemExit, match=message):
        zero.run(args)


def _result():
    peaks = {"none": [3000 * MIB] * 2, "optimizer": [1700 * MIB] * 2,
             "gradients": [1500 * MIB] * 2}
    row = {"strategy": "multi_worker", "peak_bytes": peaks,
           "saved_over_expected": {"optimizer": 3.4, "gradients": 1.25},
           "step_s": {"none": 4.0, "optimizer": 2.0, "gradients": 2.1},
           "step_ratio": {"optimizer": 0.5, "gradients": 0.525}}
    shm = {"strategy": "shm", "peak_bytes": {**peaks, "parameters": [900 * MIB] * 2},
           "saved_over_expected": {**row["saved_over_expected"], "parameters": 0.93},
           "step_s": {**row["step_s"], "parameters": 2.6},
           "step_ratio": {**row["step_ratio"], "parameters": 0.65},
           "parameters_bound_bytes": 800 * MIB, "baseline_peak_bytes": 300 * MIB,
           "parameters_peak_over_bound": 1.125}
    return {"model": "m", "workers": 2, "levels": list(zero.LEVELS), "state_bytes": 514 * MIB,
            "weight_bytes": 257 * MIB,
            "expected_saving_bytes": {"optimizer": 257 * MIB, "gradients": 385 * MIB,
                                      "parameters": 514 * MIB},
            "rows": [shm, row],
            "goals": {"saved_over_expected": 0.8, "step_ratio": 1.1,
                      "gradients_over_optimizer_step": 1.05, "parameters_step_ratio": 1.3,
                      "parameters_peak_over_bound": 1.25}}


def test_table_and_plot_show_every_strategy():
    from matplotlib.figure import Figure

    text = zero.table(_result())
    assert "shm" in text and "multi_worker" in text and "3.40" in text and "0.50" in text
    assert "gradients" in text and "1.25" in text and "0.53" in text
    assert "parameters" in text and "0.93" in text and "0.65" in text
    # shm's row, its bound's line, and the goals; multi_worker has none
    assert text.count("parameters") == 4, text
    assert "peak / bound (800 MiB, baseline 300): 1.12" in text, text
    assert "parameters' step ratio <= 1.3, peak / bound <= 1.25" in text
    fig = Figure()
    zero.plot(_result(), fig)
    assert len(fig.axes) == 2
