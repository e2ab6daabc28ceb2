"""Where this process's output goes: a terminal or a pipe, and how loud TensorFlow may be.

Like the cluster environments, this is the one place that reads its
environment variables (TFDIST_TF_LOGS, TFDIST_PROGRESS_S) and looks at the terminal, so that the
rest of tfdist takes a `Console` and is testable without either.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Mapping

TF_LOGS_VAR = "TFDIST_TF_LOGS"
PROGRESS_VAR = "TFDIST_PROGRESS_S"
DEFAULT_PROGRESS_S = 30.0
_TRUE = {"1", "true", "yes", "on"}


@dataclasses.dataclass(frozen=True)
class Console:
    """How this process should talk.

    Attributes:
        interactive: stdout is a terminal: Keras progress bars redraw in place
            there, and become escape codes and fragments in a pipe or a file.
        tf_logs: Show TensorFlow's C++ start-up lines (TFDIST_TF_LOGS=1).
        progress_s: Seconds between the chief's progress lines during an epoch
            where Keras prints one line per epoch (TFDIST_PROGRESS_S; 0: none;
            `tfdist.progress`).
    """

    interactive: bool = False
    tf_logs: bool = False
    progress_s: float = DEFAULT_PROGRESS_S


def progress_interval(raw: str | None) -> float:
    """Pure function: TFDIST_PROGRESS_S as seconds (unset or empty: 30).

    Raises:
        ConfigError: for anything but a number >= 0, naming the variable.
    """
    from tfdist.errors import ConfigError

    if raw is None or not raw.strip():
        return DEFAULT_PROGRESS_S
    try:
        value = float(raw.strip())
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ConfigError(f"{PROGRESS_VAR} must be a number of seconds >= 0 (0: no progress "
                          f"lines). Received: {raw!r}.")
    return value


def detect_console(environ: Mapping[str, str] | None = None, stream=None) -> Console:
    """The Console of this process.

    Args:
        environ: Environment to read; defaults to `os.environ`.
        stream: The stream progress goes to; defaults to `sys.stdout`.
    """
    environ = os.environ if environ is None else environ
    stream = sys.stdout if stream is None else stream
    try:
        interactive = bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        interactive = False
    return Console(interactive=interactive,
                   tf_logs=environ.get(TF_LOGS_VAR, "").strip().lower() in _TRUE,
                   progress_s=progress_interval(environ.get(PROGRESS_VAR)))
