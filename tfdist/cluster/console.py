"""Where this process's output goes: a terminal or a pipe, and how loud TensorFlow may be.

Like the cluster environments, this is the one place that reads its
environment variable (TFDIST_TF_LOGS) and looks at the terminal, so that the
rest of tfdist takes a `Console` and is testable without either.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Mapping

TF_LOGS_VAR = "TFDIST_TF_LOGS"
_TRUE = {"1", "true", "yes", "on"}


@dataclasses.dataclass(frozen=True)
class Console:
    """How this process should talk.

    Attributes:
        interactive: stdout is a terminal: Keras progress bars redraw in place
            there, and become escape codes and fragments in a pipe or a file.
        tf_logs: Show TensorFlow's C++ start-up lines (TFDIST_TF_LOGS=1).
    """

    interactive: bool = False
    tf_logs: bool = False


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
                   tf_logs=environ.get(TF_LOGS_VAR, "").strip().lower() in _TRUE)
