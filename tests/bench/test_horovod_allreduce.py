"""The horovod-allreduce benchmark's arithmetic and import hygiene (no timing here)."""

import subprocess
import sys

import pytest

from tests.conftest import REPO, clean_env
from tfdist.bench.horovod_allreduce import bus_bandwidth


def test_bus_bandwidth_follows_nccl_tests():
    assert bus_bandwidth(1.0, 2) == 1.0
    assert bus_bandwidth(1.0, 4) == 1.5
    assert bus_bandwidth(1.0, 1) == 1.0


@pytest.mark.integration
def test_module_imports_no_tensorflow():
    code = ("import sys, tfdist.bench.horovod_allreduce; "
            "sys.exit('tensorflow' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], env=clean_env(PYTHONPATH=REPO),
                          cwd=REPO, timeout=60)
    assert proc.returncode == 0
