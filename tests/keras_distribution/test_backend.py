"""Keras's `initialize` arguments and TFDIST_DEVICES, read before TensorFlow starts."""

from __future__ import annotations

import pytest

from tfdist.cluster import local_devices_requested
from tfdist.errors import ConfigError
from tfdist.keras_distribution.backend import _tf_config_from


def test_job_addresses_become_tf_config():
    assert _tf_config_from("127.0.0.1:1, 127.0.0.1:2", 2, 1) == {
        "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
        "task": {"type": "worker", "index": 1}}


@pytest.mark.parametrize("args, words", [
    (("a:1,b:2", 3, 0), "num_processes=3"),
    (("a:1,b:2", 2, None), "process_id=None"),
    (("a:1,b:2", 2, 2), "process_id=2"),
])
def test_inconsistent_arguments_are_refused(args, words):
    with pytest.raises(ConfigError, match=words):
        _tf_config_from(*args)


def test_tfdist_devices():
    assert local_devices_requested({}) == 0
    assert local_devices_requested({"TFDIST_DEVICES": "4"}) == 4
    for bad in ("0", "two", "-1"):
        with pytest.raises(ConfigError, match=f"TFDIST_DEVICES={bad!r}"):
            local_devices_requested({"TFDIST_DEVICES": bad})
