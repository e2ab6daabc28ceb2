"""A Keras callback that timestamps training steps, for steady-state throughput."""

from __future__ import annotations

import os
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


def start_barrier(directory: str, parties: int, after_steps: int = 0, timeout_s: float = 600.0):
    """A callback that holds training until `parties` processes have run `after_steps` steps.

    For processes that train alone but must run at the same time (the scaling
    benchmark's no-communication control): each writes a file named by its pid
    into `directory` after its first `after_steps` steps (its warm-up; 0: at
    the start of training) and waits until `parties` files are there, so that
    all start their timed steps together. Start-up (imports, building the
    model, tracing the step) takes seconds and varies, so without it the first
    process to start would time its steps on a quieter machine than the others.
    Put it before the step timer, so that the timer's stamp of the last held
    step is taken after the wait.

    Raises:
        RuntimeError: when the others are not there within `timeout_s`.
    """
    import keras

    class StartBarrier(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.steps = 0

        def on_train_begin(self, logs=None):
            if after_steps == 0:
                self._wait()

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1
            if self.steps == after_steps:
                self._wait()

        def _wait(self):
            arrived(directory)
            deadline = time.monotonic() + timeout_s
            while len(os.listdir(directory)) < parties:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{len(os.listdir(directory))} of {parties} processes reached the start "
                        f"barrier in {directory} within {timeout_s:g} s.")
                time.sleep(0.001)

    return StartBarrier()


def arrived(directory: str) -> None:
    """Marks this process as arrived at the start barrier in `directory`."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, str(os.getpid())), "w", encoding="utf-8"):
        pass


class AllDone(Exception):
    """Raised by `until_all_done` to end `fit` once every process has run its steps."""


def until_all_done(directory: str, parties: int, steps: int):
    """A callback that keeps training until `parties` processes have each run `steps` steps.

    For processes that train alone but are timed together (the scaling
    benchmark's control): a process that is through its own steps keeps
    stepping, so that the others' steps stay contended, and every process
    ends at its first step end after the last one got through. Each writes a
    file named by its pid into `directory` after `steps` steps; then it raises
    `AllDone` at the first step end where `parties` files are there. Put it
    after the step timer, so that the last step is stamped. The process must
    be given more steps than `steps` (a cap: it then ends there).
    """
    import keras

    class UntilAllDone(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.steps = 0

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1
            if self.steps == steps:
                arrived(directory)
            if self.steps >= steps and len(os.listdir(directory)) >= parties:
                raise AllDone(f"{parties} processes ran {steps} steps")

    return UntilAllDone()
