"""Preemption and Ctrl-C: turn SIGTERM or SIGINT into "save a backup at the next step boundary".

The signal handler only sets a flag. Workers then agree, at the same step on
every worker, whether any of them was signalled (a tiny all-reduce every
`check_every` steps: `Hooks.any_worker`, on the job's host collectives,
`tfdist.collectives`), so all stop after the same step and the chief's backup
is consistent; stopping on one worker alone would leave the others blocked in
the next collective.

`catch_signals` (what `python -m tfdist.train` uses, as the first thing it
does) makes that hold whenever a signal arrives, start-up and the final save
included (issue 48: 1 SIGTERM of 7 under load ended with 143, no backup, no
status file). Signal handlers alone cannot: until the trainer installed its
handler, and again after it restored the old one, SIGTERM had its default
action (death, 143) and SIGINT raised KeyboardInterrupt wherever the main
thread was (inside TensorFlow included); and building a MultiWorkerMirrored
strategy replaces any handler with TensorFlow's C++ `SigtermNotifier`, which
only logs. So both signals are blocked instead, in the main thread before any
other thread exists (every thread TensorFlow starts later inherits the mask),
and one thread takes them with `sigtimedwait`: no handler is ever run, so
none can be replaced, and a signal that comes at any moment is recorded.
"""

from __future__ import annotations

import os
import signal
import threading
import time

# The agreement is a collective across processes: an eager all-reduce of one
# scalar that also stops Keras from running ahead. Measured on 2 MWMS workers
# (python -m tfdist.bench overhead): about 6 ms a step when done every step,
# which cost 18-23% of throughput. Every 20 steps it is under 1%, and a
# SIGTERM still gets its backup within 20 steps (Slurm's grace is minutes).
MULTI_PROCESS_CHECK_STEPS = 20
SECOND_INTERRUPT_AFTER_S = 0.5  # a SIGINT this long after the first means "stop now"


class Preempted(Exception):
    """Training stopped on SIGTERM, or SIGINT (`interrupted`), after saving a backup
    (`backup`; None when no step was trained, so there was nothing to save)."""

    def __init__(self, message: str, backup: str | None, interrupted: bool = False):
        super().__init__(message)
        self.backup = backup
        self.interrupted = interrupted


def default_check_steps(num_processes: int) -> int:
    """Pure function: steps between agreements when the user did not choose.

    One process needs no collective to decide, so it checks every step.
    """
    return 1 if num_processes <= 1 else MULTI_PROCESS_CHECK_STEPS


class PreemptionWatcher:
    """Records that SIGTERM or SIGINT (or the given signals) arrived.

    The first signal asks for a save at the next agreed step. A second SIGINT
    (Ctrl-C pressed again) stops the process at once, saving nothing more.

    Args:
        signals: Signals that mean "save and exit".
    """

    def __init__(self, signals=(signal.SIGTERM, signal.SIGINT)):
        self.requested = False
        self.signum: int | None = None
        self._first_at = 0.0
        self._old = {}
        if threading.current_thread() is threading.main_thread():
            for s in signals:
                self._old[s] = signal.signal(s, self._handle)

    @property
    def interrupted(self) -> bool:
        """True when the stop was asked by SIGINT (Ctrl-C), not by a scheduler's SIGTERM."""
        return self.signum == signal.SIGINT

    @property
    def cause(self) -> str:
        """'interrupted' (Ctrl-C) or 'preempted by signal N', for the stop's message."""
        return "interrupted" if self.interrupted else f"preempted by signal {self.signum}"

    def _handle(self, signum, _frame):
        # One Ctrl-C reaches a launched worker twice (the terminal's process group,
        # then the launcher's forward, within milliseconds): only a later one is a second.
        now = time.monotonic()
        if (self.requested and signum == signal.SIGINT
                and now - self._first_at >= SECOND_INTERRUPT_AFTER_S):
            os.write(2, b"tfdist: second interrupt: stopping now, without saving.\n")
            os._exit(130)  # exit_codes.INTERRUPTED; no clean-up can hang now
        if not self.requested:
            self._first_at = now
        self.requested = True
        self.signum = self.signum or signum

    def uninstall(self) -> None:
        """Restores the previous handlers."""
        for s, handler in self._old.items():
            signal.signal(s, handler)
        self._old = {}


class SignalCatcher(PreemptionWatcher):
    """A `PreemptionWatcher` that takes SIGTERM and SIGINT with `sigtimedwait`.

    Both signals are blocked in the calling thread (the main thread, before it
    starts any other: threads inherit the mask), so every thread of the
    process blocks them and the kernel keeps them pending until the waiting
    thread takes them. A handler (Python's or TensorFlow's) is never run.
    """

    POLL_S = 0.2  # how often the waiting thread looks whether it is to stop

    def __init__(self, signals=(signal.SIGTERM, signal.SIGINT)):
        self.requested = False
        self.signum = None
        self._first_at = 0.0
        self._old = {}
        self._signals = set(signals)
        self._stop = threading.Event()
        # A signal whose action is SIG_IGN is discarded even while blocked
        # (`cmd &` starts a program with SIGINT ignored): default actions first.
        for s in self._signals:
            if signal.getsignal(s) == signal.SIG_IGN:
                self._old[s] = signal.signal(s, signal.SIG_DFL)
        self._was_blocked = signal.pthread_sigmask(signal.SIG_BLOCK, self._signals)
        self._thread = threading.Thread(target=self._wait, daemon=True,
                                        name="tfdist-signals")
        self._thread.start()

    def _wait(self) -> None:
        while not self._stop.is_set():
            info = signal.sigtimedwait(self._signals, self.POLL_S)
            # Only a signal of the set asks for a stop: a rank of a Slurm step once
            # reported "preempted by signal 1205072368" after its last step (a
            # siginfo whose number is none of them; seen once, not reproduced).
            if info is not None and info.si_signo in self._signals:
                self._handle(info.si_signo, None)

    def uninstall(self, redeliver: bool = False) -> None:
        """Stops taking the signals; one still pending is then acted on as before.

        Args:
            redeliver: Send the signal already recorded again, now that it has
                its usual action (for a loop that does not act on the record).
        """
        global _current
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        signal.pthread_sigmask(signal.SIG_SETMASK, self._was_blocked)
        super().uninstall()
        if _current is self:
            _current = None
        if redeliver and self.requested:
            self.requested, signum, self.signum = False, self.signum, None
            os.kill(os.getpid(), signum)


_current: SignalCatcher | None = None


def catch_signals() -> PreemptionWatcher:
    """From now on SIGTERM and SIGINT are recorded, whenever they arrive.

    Call it from the main thread before any other thread starts (a thread
    started earlier does not block the signals, and one delivered to it would
    run the handler of the moment). `current()` returns it until `uninstall()`.
    """
    global _current
    if threading.current_thread() is not threading.main_thread():
        return PreemptionWatcher()  # installs nothing off the main thread, as before
    if _current is None:
        _current = SignalCatcher()
    return _current


def current() -> PreemptionWatcher | None:
    """The process's `catch_signals()` watcher, or None."""
    return _current
