"""Progress lines during an epoch, for output that is not a terminal.

Into a pipe or a file (`tfdist.launch`, Slurm, `| tee`) Keras prints one line
per epoch (`--verbose auto` becomes 2 there: a bar would be escape codes), so
a long epoch says nothing for minutes. With verbose 2 the chief also prints,
at the first step end after every interval (30 s; `TFDIST_PROGRESS_S`, read by
`tfdist.cluster.console`; 0: never), one line:

    tfdist: epoch 2/5 step 120/312 (38%): 412 examples/s, 0:31 in, ETA 0:46, loss 1.2345

On a terminal Keras's progress bar stays (verbose 1); `--verbose 0` prints
nothing. Time-based, not step-based: the first line comes about one interval
into the epoch whatever a step costs (a step longer than the interval gives a
line per step). The rate is timed from the end of the epoch's first step, so
a first step that traces the model does not inflate the ETA.

`line` and `rate` are pure; `Ticker` keeps the time (its clock injectable)
and is driven by the fit loops' callback (`make_callback`, joined to Keras's
own bar by `tfdist.callbacks.make_progress_bar`) and by the parameter-server
coordinator's loop (`tfdist.run.coordinator`). Only the chief makes one.
"""

from __future__ import annotations

import time
from typing import Callable

DEFAULT_INTERVAL_S = 30.0


def duration(seconds: float) -> str:
    """Pure function: '46 s', '2:05' or '1:02:03' for a number of seconds."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} s"
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def rate(steps: int, seconds: float) -> float:
    """Pure function: steps per second (0.0 when nothing was timed)."""
    return steps / seconds if steps > 0 and seconds > 0 else 0.0


def line(epoch: int, epochs: int, step: int, steps: int, elapsed_s: float,
         steps_per_s: float, examples_per_step: int, loss: float | None = None) -> str:
    """Pure function: one progress line (without the 'tfdist: ' prefix).

    Args:
        epoch: The epoch, counted from 1.
        epochs: The run's epochs.
        step: Steps of this epoch done (a resumed epoch counts the ones before it).
        steps: Steps in an epoch.
        elapsed_s: Seconds since this epoch (or its resumed part) began.
        steps_per_s: The measured rate (0: unknown, no ETA).
        examples_per_step: The global batch: examples every replica together take per step.
        loss: The epoch's running loss, or None.
    """
    pct = 100.0 * step / steps if steps else 0.0
    out = (f"epoch {epoch}/{epochs} step {step}/{steps} ({pct:.0f}%): "
           f"{steps_per_s * examples_per_step:.0f} examples/s, {duration(elapsed_s)} in")
    if steps_per_s > 0 and steps:
        out += f", ETA {duration(max(0, steps - step) / steps_per_s)}"
    if loss is not None:
        out += f", loss {loss:.4f}"
    return out


class Ticker:
    """Says a progress line at the first step end after every `interval_s`.

    Args:
        epochs: The run's epochs.
        steps_per_epoch: Steps in a full epoch.
        examples_per_step: The global batch.
        interval_s: Seconds between lines (0: never).
        clock: Monotonic seconds (injectable for tests).
        say: Where a line goes (default: print on stdout, flushed, 'tfdist: ' first).
    """

    def __init__(self, epochs: int, steps_per_epoch: int, examples_per_step: int,
                 interval_s: float = DEFAULT_INTERVAL_S, clock: Callable[[], float] = time.monotonic,
                 say: Callable[[str], None] | None = None):
        self.epochs, self.steps, self.examples = epochs, steps_per_epoch, examples_per_step
        self.interval_s, self.clock = interval_s, clock
        self.say = say or (lambda text: print(f"tfdist: {text}", flush=True))
        self.begin_epoch(0)

    def begin_epoch(self, epoch: int, first_step: int = 0) -> None:
        """Epoch `epoch` (from 0) starts, at step `first_step` of it (a resumed epoch)."""
        self.epoch, self.first = epoch, first_step
        self.started = self.last = self.clock()
        self.mark = None  # (step, time) at the end of the first step of this part

    def step(self, step: int, loss: Callable[[], float | None] | float | None = None):
        """Step `step` of the epoch (counted from 1, in the whole epoch) has ended.

        Args:
            loss: The running loss, or a function giving it (called only when a
                line is due: reading a tensor can wait for the device).

        Returns:
            The line said, or None.
        """
        now = self.clock()
        if self.mark is None:
            self.mark = (step, now)
        if not self.interval_s or now - self.last < self.interval_s:
            return None
        self.last = now
        timed_steps, timed_s = step - self.mark[0], now - self.mark[1]
        if timed_steps <= 0:  # only the first step so far: time it all
            timed_steps, timed_s = step - self.first, now - self.started
        value = loss() if callable(loss) else loss
        text = line(self.epoch + 1, self.epochs, step, self.steps, now - self.started,
                    rate(timed_steps, timed_s), self.examples,
                    None if value is None else float(value))
        self.say(text)
        return text


def make_callback(ticker: Ticker):
    """A Keras callback driving `ticker` from `fit` (only where Keras's verbose is 2).

    A resumed run's partial epoch is a `fit` of fewer steps (`params["steps"]`):
    its steps are counted from where the epoch was left.
    """
    import keras

    class Progress(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            steps = (self.params or {}).get("steps") or ticker.steps
            ticker.begin_epoch(epoch, first_step=max(0, ticker.steps - steps))

        def on_train_batch_end(self, batch, logs=None):
            loss = (logs or {}).get("loss")
            ticker.step(ticker.first + batch + 1, (lambda: loss) if loss is not None else None)

    return Progress()
