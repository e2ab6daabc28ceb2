"""Strategy names and `auto` resolution (pure), and building in-process."""

import pytest

from tfdist import strategies
from tfdist.cluster import detect
from tfdist.errors import ConfigError

LOCAL = detect({})
TWO = detect({"TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:1"]}, '
                           '"task": {"type": "worker", "index": 0}}'})


def test_unknown_name_lists_valid_ones():
    with pytest.raises(ConfigError, match=r"Unknown strategy 'horovd'\. Valid strategies: "
                                          r"\['auto', 'single', 'mirrored', 'multi_worker'"):
        strategies.build_strategy("horovd", LOCAL)


@pytest.mark.parametrize("cluster, devices, gpus, expected", [
    (LOCAL, None, 0, "single"), (LOCAL, 2, 0, "mirrored"), (LOCAL, None, 4, "mirrored"),
    (LOCAL, 1, 4, "single"), (TWO, None, 0, "multi_worker"), (TWO, 2, 0, "multi_worker")])
def test_auto_resolution(cluster, devices, gpus, expected):
    assert strategies.resolve_name("auto", cluster, devices, gpus) == expected
    assert strategies.resolve_name("mirrored", cluster, devices, gpus) == "mirrored"


def test_single_and_too_many_devices():
    import tensorflow as tf

    s = strategies.build_strategy("single", LOCAL)
    assert s.num_replicas_in_sync == 1
    n = len(tf.config.list_logical_devices("CPU"))
    with pytest.raises(ConfigError, match=rf"devices={n + 5} but this machine has {n} "
                                          r"logical CPU device\(s\)"):
        strategies.build_strategy("mirrored", LOCAL, strategies.StrategyOptions(devices=n + 5))


def test_bad_collective_name():
    from tfdist.strategies.multi_worker import communication_options

    with pytest.raises(ConfigError, match=r"collective must be one of \['auto', 'ring', "
                                          r"'nccl'\]\. Received: collective='mpi'"):
        communication_options("mpi", 10)
    assert communication_options("ring", 10).timeout_seconds == 10
