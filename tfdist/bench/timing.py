"""A Keras callback that timestamps training steps, for steady-state throughput."""

from __future__ import annotations

import time


def step_timer():
    """A callback recording `time.perf_counter()` at the end of every training step."""
    import keras

    class StepTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times: list[float] = []

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter())

    return StepTimer()


def steady_step_s(times: list[float], warmup: int) -> float:
    """Pure function: mean seconds per step after the first `warmup` steps.

    The first steps trace and compile the step function; they are start-up,
    not throughput.

    Raises:
        ValueError: with fewer than warmup + 2 timestamps.
    """
    if len(times) < warmup + 2:
        raise ValueError(f"need at least warmup + 2 = {warmup + 2} step times. "
                         f"Received: {len(times)}.")
    return (times[-1] - times[warmup]) / (len(times) - 1 - warmup)
