"""Progress lines during an epoch into a pipe (`tfdist.progress`): the line's
arithmetic, the time-based ticker, TFDIST_PROGRESS_S, and the fit callback
(lines only where Keras prints one line per epoch, verbose 2)."""

import io
import re

import pytest

from tfdist import progress
from tfdist.cluster import detect_console
from tfdist.cluster.console import DEFAULT_PROGRESS_S, progress_interval
from tfdist.errors import ConfigError


def test_duration_reads_as_seconds_minutes_hours():
    assert progress.duration(0) == "0 s"
    assert progress.duration(46.4) == "46 s"
    assert progress.duration(125) == "2:05"
    assert progress.duration(3723) == "1:02:03"
    assert progress.duration(-3) == "0 s"


def test_line_has_step_rate_elapsed_eta_and_loss():
    # 120 of 312 steps at 4 steps/s of 64 examples: 256 examples/s, 192 steps left = 48 s.
    text = progress.line(2, 5, 120, 312, 31.2, 4.0, 64, loss=1.23456)
    assert text == ("epoch 2/5 step 120/312 (38%): 256 examples/s, 31 s in, ETA 48 s, "
                    "loss 1.2346")
    assert progress.line(1, 1, 10, 20, 5, 0.0, 64) == "epoch 1/1 step 10/20 (50%): 0 examples/s, 5 s in"
    assert "ETA 0 s" in progress.line(1, 1, 20, 20, 5, 2.0, 8)
    assert "ETA 1:30:00" in progress.line(1, 1, 0, 5400, 1, 1.0, 8)


def test_rate_is_zero_when_nothing_was_timed():
    assert progress.rate(0, 5) == 0.0
    assert progress.rate(5, 0) == 0.0
    assert progress.rate(10, 4) == 2.5


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_ticker_says_a_line_at_the_first_step_after_each_interval_timed_past_the_first_step():
    clock, said = _Clock(), []
    ticker = progress.Ticker(3, 100, 10, interval_s=30, clock=clock, say=said.append)
    ticker.begin_epoch(1)
    clock.now += 20  # the first step traces the model: 20 s
    assert ticker.step(1) is None
    for k in range(2, 11):  # then 1 s a step
        clock.now += 1
        assert ticker.step(k, loss=lambda: 0.5) is None  # 29 s in: not yet
    clock.now += 1
    text = ticker.step(11, loss=lambda: 0.5)
    # 10 steps in 10 s after the first: 1 step/s, 10 examples/s; 89 steps left.
    assert text == "epoch 2/3 step 11/100 (11%): 10 examples/s, 30 s in, ETA 1:29, loss 0.5000"
    assert said == [text]
    clock.now += 29
    assert ticker.step(12) is None
    clock.now += 1
    assert ticker.step(13).startswith("epoch 2/3 step 13/100")  # 30 s after the last line
    assert len(said) == 2


def test_ticker_reads_the_loss_only_when_a_line_is_due_and_a_slow_step_gives_one_line():
    clock, read = _Clock(), []
    ticker = progress.Ticker(1, 4, 8, interval_s=30, clock=clock, say=lambda s: None)

    def loss():
        read.append(1)
        return 2.0

    clock.now += 1
    ticker.step(1, loss)
    assert read == []
    clock.now += 100  # one step longer than the interval: timed on its own
    assert ticker.step(2, loss) == ("epoch 1/1 step 2/4 (50%): 0 examples/s, 1:41 in, "
                                    "ETA 3:20, loss 2.0000").replace("0 examples/s", "0 examples/s")
    assert read == [1]


def test_a_resumed_epoch_counts_its_steps_from_where_it_was_left():
    clock, said = _Clock(), []
    ticker = progress.Ticker(2, 100, 1, interval_s=5, clock=clock, say=said.append)
    ticker.begin_epoch(0, first_step=60)
    clock.now += 6
    # Only its first step so far: timed from the part's start (1 step in 6 s).
    assert ticker.step(61).startswith("epoch 1/2 step 61/100 (61%): 0 examples/s, 6 s in, "
                                      "ETA 3:54")


def test_interval_zero_says_nothing():
    clock = _Clock()
    ticker = progress.Ticker(1, 10, 1, interval_s=0, clock=clock, say=pytest.fail)
    for k in range(1, 11):
        clock.now += 100
        assert ticker.step(k) is None


def test_progress_interval_variable():
    assert progress_interval(None) == DEFAULT_PROGRESS_S == 30.0
    assert progress_interval(" ") == 30.0
    assert progress_interval("2") == 2.0
    assert progress_interval("0") == 0.0
    assert detect_console({"TFDIST_PROGRESS_S": "1.5"}, io.StringIO()).progress_s == 1.5
    for bad in ("-1", "5s", "nan", "inf"):
        with pytest.raises(ConfigError, match="TFDIST_PROGRESS_S must be a number of seconds"):
            progress_interval(bad)


def _fit(verbose, epochs=1, initial_epoch=0, steps=6, total_epochs=None, steps_per_epoch=6):
    import keras
    import numpy as np

    from tfdist.callbacks import make_progress_bar

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.zeros((48, 2), "float32")
    bar = make_progress_bar(total_epochs or epochs, steps_per_epoch, 8, interval_s=1e-9)
    model.fit(x, x[:, :1], batch_size=8, epochs=epochs, initial_epoch=initial_epoch,
              steps_per_epoch=steps, verbose=verbose, callbacks=[bar])


def _lines(out):
    return [line for line in out.splitlines() if line.startswith("tfdist: epoch")]


def test_fit_prints_progress_lines_only_with_verbose_2(capsys):
    _fit(2, epochs=2)
    lines = _lines(capsys.readouterr().out)
    assert [re.match(r"tfdist: epoch (\d)/2 step (\d)/6 ", x).groups() for x in lines] == [
        (e, s) for e in "12" for s in "123456"]  # every step (an interval of ~0)
    assert re.search(r"examples/s, \d+ s in, ETA \d+ s, loss \d+\.\d{4}$", lines[-1])
    for verbose in (0, 1):
        _fit(verbose)
        assert _lines(capsys.readouterr().out) == []


def test_fit_of_a_resumed_partial_epoch_numbers_its_steps_in_the_whole_epoch(capsys):
    # Epoch 2 of 3 resumed at step 2 of 6: a fit of 4 steps (as FitRun runs it).
    _fit(2, epochs=2, initial_epoch=1, steps=4, total_epochs=3)
    lines = _lines(capsys.readouterr().out)
    assert [x.split(":")[1].strip() for x in lines] == [
        f"epoch 2/3 step {s}/6 ({100 * s / 6:.0f}%)" for s in (3, 4, 5, 6)]
