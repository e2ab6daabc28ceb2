"""The `horovod` adapter without Horovod: registry, auto, hooks, install hint."""

import subprocess
import sys

import pytest

from tests.conftest import REPO, clean_env
from tfdist import strategies
from tfdist.cluster import detect
from tfdist.horovod import runtime


def test_registered_and_auto_picks_it_under_horovodrun():
    assert "horovod" in strategies.valid_names()
    cluster = detect({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"})
    assert strategies.resolve_name("auto", cluster, None, 0) == "horovod"


def test_hooks_shard_by_rank_and_count_processes():
    cluster = detect({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "4"})
    hooks = strategies.build_hooks("horovod", cluster)
    assert hooks.num_replicas(strategy=None) == 4
    assert hooks.input_shard() == (4, 1)
    # Other adapters keep the defaults.
    plain = strategies.build_hooks("single", cluster)
    assert plain.input_shard() is None and plain.wrap_optimizer("opt") == "opt"
    assert plain.callbacks(0.1) == []


@pytest.mark.parametrize("gpus, local_rank, expected", [(0, 3, None), (4, 1, 1), (2, 3, 1)])
def test_gpu_by_local_rank(gpus, local_rank, expected):
    assert runtime.gpu_for_local_rank(gpus, local_rank) == expected


@pytest.mark.integration
def test_missing_horovod_is_one_clear_error_before_tensorflow():
    # Hide horovod even where it is installed: this is the "not installed" case.
    code = ("import sys; sys.modules['horovod'] = None; from tfdist.train import main; "
            "rc = main(['digits_mlp', '--strategy', 'horovod']); "
            "assert 'tensorflow' not in sys.modules; sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=clean_env(PYTHONPATH=REPO), cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("error: --strategy horovod needs Horovod, which is not installed")
    assert "scripts/install_horovod.sh" in proc.stderr and "tfdist[horovod]" in proc.stderr
    assert "Traceback" not in proc.stderr
