"""`python -m tfdist.env`: versions, build flags, devices and the discovered cluster."""

import importlib.metadata
import json
import os

import pytest

from tests.conftest import clean_env, run_py, tail
from tfdist import env

HOROVOD_VENV = os.environ.get("TFDIST_HOROVOD_VENV") or os.path.expanduser(
    "~/.cache/tfdist/horovod-venv")


def test_missing_horovod_venv_is_reported_with_the_install_hint(tmp_path):
    report = env.horovod_report(str(tmp_path / "nowhere"))
    assert report["venv"] == str(tmp_path / "nowhere")
    assert "not found: run scripts/install_horovod.sh" in report["venv_status"]
    # #48: a venv that exists without Horovod in it (a failed build) says so.
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text("#!/bin/sh\n")
    (bin_dir / "python").chmod(0o755)
    assert env.horovod_report(str(tmp_path / "venv"))["venv_status"] == (
        "exists without Horovod (no bin/horovodrun): run scripts/install_horovod.sh (or set "
        "TFDIST_HOROVOD_VENV)")


def test_render_is_indented_key_value_lines():
    text = env.render({"a": {"b": 1, "c": None}, "d": "x"})
    assert text.splitlines() == ["a:", "  b: 1", "  c: -", "d: x"]


def test_render_says_none_for_an_empty_section():
    # `environment` is empty when no cluster variable is set: no bare heading.
    text = env.render({"environment": {}, "slurm": {"srun": None}})
    assert text.splitlines() == ["environment: none", "slurm:", "  srun: -"]


@pytest.mark.integration
def test_env_reports_versions_build_flags_and_the_cluster():
    has_venv = os.access(os.path.join(HOROVOD_VENV, "bin", "horovodrun"), os.X_OK)
    if not has_venv and os.environ.get("CI"):
        pytest.fail(f"CI: the Horovod venv {HOROVOD_VENV} is missing (scripts/install_horovod.sh)")
    tf_config = {"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                 "task": {"type": "worker", "index": 1}}
    proc = run_py(["-m", "tfdist.env", "--json"], timeout=300,
                  env=clean_env(TF_CONFIG=json.dumps(tf_config),
                                TFDIST_HOROVOD_VENV=HOROVOD_VENV))
    assert proc.returncode == 0, tail(proc)
    report = json.loads(proc.stdout)
    assert report["packages"]["tensorflow"] == importlib.metadata.version("tensorflow")
    assert report["packages"]["keras"] == importlib.metadata.version("keras")
    assert report["python"]["version"].count(".") == 2
    assert report["devices"]["tensorflow_devices"]["CPU"]
    assert report["cluster"] == {**report["cluster"], "source": "tf_config", "num_workers": 2,
                                 "worker_index": 1, "is_chief": False,
                                 "workers": tf_config["cluster"]["worker"]}
    assert json.loads(report["environment"]["TF_CONFIG"]) == tf_config
    if has_venv:
        build = report["horovod"]["venv_build"]
        assert build["horovod"] == "0.28.1" and build["gloo"] is True, report["horovod"]
    else:
        assert report["horovod"]["venv_status"].startswith("not found")
    assert set(report["slurm"]) >= {"sbatch", "srun", "sinfo"} and "ssh" in report["ssh"]
    assert "cudart_stub" not in proc.stderr and "absl::InitializeLog" not in proc.stderr
