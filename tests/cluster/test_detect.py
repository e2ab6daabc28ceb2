"""Detection order and forced sources."""

import pytest

from tfdist.cluster import detect
from tfdist.errors import ClusterError


def test_empty_environment_is_local_chief():
    info = detect({})
    assert (info.source, info.num_workers, info.worker_index, info.is_chief) == (
        "local", 1, 0, True)
    assert info.tf_config is None and not info.is_multi_worker


def test_forced_source_must_be_present():
    with pytest.raises(ClusterError, match="'slurm' was requested but"):
        detect({}, source="slurm")
    with pytest.raises(ClusterError, match=r"Unknown cluster source 'yarn'; valid: \['auto', "):
        detect({}, source="yarn")


def test_reads_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1", "b:1"]}, '
                                    '"task": {"type": "worker", "index": 1}}')
    assert detect().worker_index == 1
