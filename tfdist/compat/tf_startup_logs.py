"""tensorflow/tensorflow#79029: TensorFlow's C++ start-up lines ignore TF_CPP_MIN_LOG_LEVEL.

Importing TensorFlow 2.21 on a CPU-only machine prints, per process,
absl's "WARNING: All log messages before absl::InitializeLog() is called are
written to STDERR" twice (TensorFlow logs before initialising absl logging;
the fix, tensorflow/tensorflow#102212, is not in a release), each followed by
"I0000 ... cudart_stub.cc:31] Could not find cuda drivers", and the first
device query prints "E0000 ... failed call to cuInit". TF_CPP_MIN_LOG_LEVEL
hides only the last (at 3, which also hides every later C++ error). Under a
2-worker launch that is 10 lines before tfdist says anything.

`import_tensorflow` imports TensorFlow and initialises its devices with file
descriptor 2 sent to a temporary file, then writes back everything except
glog-formatted INFO/WARNING/ERROR lines and absl's notice: Python warnings,
tracebacks and fatal (F) lines still reach stderr. Nothing is filtered after
start-up. tests/compat/test_tf_startup_logs.py shows the upstream output and
the filtered one.

`hide_float16_notice` does the same for one line printed after start-up:
oneDNN's float16 notice (see its docstring).

`install_import_filter` (run by `import tfdist`) does the same for a script's
own `import tensorflow` or `import keras` written before `tfdist.setup()`.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import re
import sys
import tempfile

UPSTREAM = "tensorflow/tensorflow#79029"

_ABSL_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
# glog/absl line: severity, MMDD, time, thread id, file:line] message. F (fatal) is kept.
_GLOG = re.compile(r"^[IWE]\d{4} [\d:.]+\s+\d+ [\w./-]+:\d+\] ")


# The second line of cpu_feature_guard's two-line INFO message.
_CONTINUATION = "To enable the following instructions: "


def is_startup_noise(line: str) -> bool:
    """Pure function: True for a C++ start-up line that tfdist hides by default."""
    line = line.rstrip("\r\n")
    return (line == _ABSL_NOTICE or line.startswith(_CONTINUATION)
            or bool(_GLOG.match(line)))


@contextlib.contextmanager
def filtered_stderr(enabled: bool = True):
    """Runs the body with fd 2 captured; replays the lines that are not start-up noise."""
    if not enabled:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", errors="replace")
            kept = [ln for ln in text.splitlines(keepends=True) if not is_startup_noise(ln)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def import_tensorflow(show_logs: bool = False):
    """Imports TensorFlow and Keras and initialises devices, quietly unless `show_logs`.

    Returns:
        The `tensorflow` module.
    """
    uninstall_import_filter()  # this import filters (or shows) on its own
    if "tensorflow" in sys.modules and show_logs:
        return sys.modules["tensorflow"]
    with filtered_stderr(not show_logs):
        import keras  # noqa: F401  (its import pulls TensorFlow's shared libraries in)
        import tensorflow as tf

        tf.config.list_physical_devices()  # platform initialisation: the cuInit line
    return tf


def hide_float16_notice(tf, enabled: bool = True) -> None:
    """Runs one float16 matmul with fd 2 filtered, so oneDNN's float16 notice is taken here.

    At a process's first float16 op TensorFlow logs, once per process,
    "E0000 ... util.cc:131] oneDNN supports DT_HALF only on platforms with
    AVX-512. Falling back to the default Eigen-based implementation if present."
    (tensorflow/core/util/util.cc) on a CPU without the float16 instructions
    oneDNN wants: this machine has AVX-512 but no AVX512_FP16, so the line reads
    as false, and under `--precision mixed_float16` it landed in epoch 1's output
    as an error with nothing to act on. Call it after the strategy is built (an
    op starts TensorFlow's runtime, which must not start before).

    Args:
        tf: The `tensorflow` module.
        enabled: False (--tf-logs) runs nothing, so the line prints where it would.
    """
    if not enabled:
        return
    with filtered_stderr():
        x = tf.ones((1, 1), tf.float16)
        tf.matmul(x, x)


# Top-level modules whose import starts TensorFlow's C++ runtime.
TF_MODULES = ("tensorflow", "keras")


class _FilteredLoader(importlib.abc.Loader):
    """A module's own loader, run with fd 2 filtered (`filtered_stderr`)."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        try:
            with filtered_stderr():
                self._loader.exec_module(module)
        finally:  # the module keeps its own loader, as if imported plainly
            module.__loader__ = module.__spec__.loader = self._loader


class _ImportFilter(importlib.abc.MetaPathFinder):
    """Filters the first import of one of `names`, then steps aside."""

    def __init__(self, names):
        self.names = tuple(names)

    def find_spec(self, name, path=None, target=None):
        if name not in self.names:
            return None
        uninstall_import_filter()  # once: every later import finds the module loaded
        spec = importlib.util.find_spec(name)  # the other finders' answer
        if spec is not None and spec.loader is not None:
            spec.loader = _FilteredLoader(spec.loader)
        return spec


def install_import_filter(names=TF_MODULES) -> None:
    """Hides TensorFlow's start-up lines in a script that imports it before `tfdist.setup()`.

    The README puts `import tensorflow` after `tfdist.setup()`, which imports
    it quietly; a script written the other way (`import tfdist`, `import
    tensorflow as tf`, then `setup()`) printed six start-up lines that setup()
    came too late to hide. After this, the first import of one of `names`
    runs as `import_tensorflow` would: fd 2 filtered. Nothing is installed
    when one of them is already imported. `import_tensorflow` removes it (it
    filters, or with --tf-logs shows, on its own).
    """
    if any(n in sys.modules for n in names) or any(
            isinstance(f, _ImportFilter) and f.names == tuple(names) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _ImportFilter(names))


def uninstall_import_filter() -> None:
    """Removes `install_import_filter`'s finder, if there."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _ImportFilter)]
