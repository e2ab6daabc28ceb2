"""tensorflow/tensorflow#79029: C++ start-up lines that TF_CPP_MIN_LOG_LEVEL does not hide.

Upstream: a process that imports TensorFlow and lists its devices with
TF_CPP_MIN_LOG_LEVEL=3 (the strictest level) still prints absl's notice and
glog-formatted lines on a CPU-only machine. Through
`tfdist.compat.tf_startup_logs.import_tensorflow` those are gone, while other
output written to stderr in the same window (a Python warning) is kept.
"""

import importlib
import sys

import pytest

from tests.conftest import clean_env, run_py, tail
from tfdist.compat import tf_startup_logs
from tfdist.compat.tf_startup_logs import is_startup_noise

NOTICE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"


@pytest.mark.parametrize("line, noise", [
    (NOTICE + "\n", True),
    ("I0000 00:00:1795340758.630534   14386 cudart_stub.cc:31] Could not find cuda drivers\n",
     True),
    ("E0000 00:00:1795340795.288708   14386 cuda_platform.cc:52] failed call to cuInit: X\n",
     True),
    ("W1122 09:41:02.123456  123 cpu_feature_guard.cc:210] This TensorFlow binary is ...", True),
    ("To enable the following instructions: AVX2 FMA, in other operations, rebuild ...", True),
    ("F0000 00:00:1795340795.288708   14386 some.cc:52] Check failed: fatal\n", False),
    ("WARNING:tensorflow:a Python-level warning\n", False),
    ("Traceback (most recent call last):\n", False),
    ("tfdist: recipe=digits_mlp\n", False),
])
def test_is_startup_noise(line, noise):
    assert is_startup_noise(line) is noise


GLOG = "I0000 00:00:1795340758.630534   14386 cudart_stub.cc:31] Could not find cuda drivers\n"


def _fake_tensorflow(tmp_path, monkeypatch, name):
    """A module whose import writes a start-up line and a traceback line to fd 2."""
    (tmp_path / f"{name}.py").write_text(
        "import os\n"
        f"os.write(2, {(NOTICE + chr(10) + GLOG).encode()!r})\n"
        "os.write(2, b'Traceback (most recent call last): kept\\n')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)


def test_a_scripts_own_import_after_import_tfdist_is_filtered(tmp_path, monkeypatch, capfd):
    # What a script importing TensorFlow before tfdist.setup() shows on stderr.
    _fake_tensorflow(tmp_path, monkeypatch, "fake_tf_plain")
    importlib.import_module("fake_tf_plain")
    assert "cudart_stub.cc" in capfd.readouterr().err  # upstream: the line shows

    _fake_tensorflow(tmp_path, monkeypatch, "fake_tf_filtered")
    tf_startup_logs.install_import_filter(names=("fake_tf_filtered",))
    try:
        module = importlib.import_module("fake_tf_filtered")
    finally:
        tf_startup_logs.uninstall_import_filter()
    err = capfd.readouterr().err
    assert "cudart_stub.cc" not in err and "absl::InitializeLog" not in err, err
    assert "Traceback (most recent call last): kept" in err
    # The module keeps its own loader; the finder steps aside after one import.
    assert type(module.__loader__).__name__ == "SourceFileLoader"
    assert not [f for f in sys.meta_path if isinstance(f, tf_startup_logs._ImportFilter)]


def test_import_filter_is_not_installed_once_tensorflow_is_imported(monkeypatch):
    monkeypatch.setitem(sys.modules, "fake_tf_loaded", object())
    tf_startup_logs.install_import_filter(names=("fake_tf_loaded",))
    assert not [f for f in sys.meta_path if isinstance(f, tf_startup_logs._ImportFilter)]


UPSTREAM = "import tensorflow as tf; tf.config.list_physical_devices()"
FIXED = ("import sys, warnings\n"
         "from tfdist.compat.tf_startup_logs import filtered_stderr, import_tensorflow\n"
         "with filtered_stderr():\n"
         "    warnings.warn('kept: a Python warning during start-up')\n"
         "tf = import_tensorflow()\n"
         "print('devices', len(tf.config.list_physical_devices()))\n")
# A script that imports TensorFlow itself, before tfdist.setup().
OWN_SCRIPT = ("import tfdist\nimport tensorflow as tf\ndist = tfdist.setup()\n"
              "dist.print('replicas', dist.num_replicas)\n")


@pytest.mark.integration
def test_upstream_prints_startup_lines_at_level_3_and_import_tensorflow_hides_them():
    upstream = run_py(["-c", UPSTREAM], timeout=180, env=clean_env(TF_CPP_MIN_LOG_LEVEL="3"))
    assert upstream.returncode == 0, tail(upstream)
    assert any(is_startup_noise(ln) for ln in upstream.stderr.splitlines()), tail(upstream)

    fixed = run_py(["-c", FIXED], timeout=180, env=clean_env(TF_CPP_MIN_LOG_LEVEL="2"))
    assert fixed.returncode == 0, tail(fixed)
    assert "devices" in fixed.stdout
    assert "kept: a Python warning during start-up" in fixed.stderr
    assert not any(is_startup_noise(ln) for ln in fixed.stderr.splitlines()), fixed.stderr

    own = run_py(["-c", OWN_SCRIPT], timeout=180, env=clean_env(TF_CPP_MIN_LOG_LEVEL="2"))
    assert own.returncode == 0 and "replicas 1" in own.stdout, tail(own)
    assert not any(is_startup_noise(ln) for ln in own.stderr.splitlines()), own.stderr


def _cpu_lacks_float16_instructions() -> bool:
    """True where TensorFlow prints oneDNN's DT_HALF notice (no AVX512_FP16 or AMX-FP16)."""
    try:
        flags = open("/proc/cpuinfo", encoding="utf-8").read()
    except OSError:
        return False
    return "avx512_fp16" not in flags and "amx_fp16" not in flags


@pytest.mark.integration
def test_mixed_float16_run_prints_no_onednn_notice_unless_tf_logs(tmp_path):
    args = ["-m", "tfdist.train", "digits_mlp", "--precision", "mixed_float16", "--epochs", "1"]
    # What a person sees: no TF_CPP_MIN_LOG_LEVEL of the tests' own (the CLI sets its default).
    env = {k: v for k, v in clean_env().items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    quiet = run_py([*args, "--model-dir", str(tmp_path / "quiet")], env=env, cwd=str(tmp_path))
    assert quiet.returncode == 0, tail(quiet)
    assert "tfdist: test " in quiet.stdout, tail(quiet)
    lines = (quiet.stdout + quiet.stderr).splitlines()
    assert not [ln for ln in lines if "DT_HALF" in ln or is_startup_noise(ln)], tail(quiet)

    shown = run_py([*args, "--model-dir", str(tmp_path / "shown"), "--tf-logs"], env=env,
                   cwd=str(tmp_path))
    assert shown.returncode == 0, tail(shown)
    if _cpu_lacks_float16_instructions():  # --tf-logs shows everything, this line included
        assert "oneDNN supports DT_HALF" in shown.stderr, tail(shown)
