"""Parameter-server checks that run before TensorFlow starts."""

import json

import pytest

from tests.conftest import clean_env, run_py

from tfdist import ps, strategies
from tfdist import straggler
from tfdist.cluster.base import ClusterInfo
from tfdist.cluster.tf_config import info_from_tf_config
from tfdist.errors import ClusterError, ConfigError

PS_CLUSTER = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"],
              "ps": ["127.0.0.1:4"]}


def _check(cfg, cluster, choice=None):
    """The run pipeline's pre-TensorFlow checks of a merged configuration."""
    from tfdist.run import trainer as run_trainer
    from tfdist.settings import Settings

    run_trainer.check_before_tensorflow(Settings.of(cfg), cluster, choice)


def _info(cluster):
    task_type = "chief" if "chief" in cluster else "worker"
    return info_from_tf_config({"cluster": cluster, "task": {"type": task_type, "index": 0}})


def test_check_cluster_accepts_chief_workers_ps():
    ps.check_cluster(_info(PS_CLUSTER))


@pytest.mark.parametrize("cluster, counts", [
    ({"worker": ["127.0.0.1:2", "127.0.0.1:3"]}, "{'chief': 0, 'worker': 2, 'ps': 0}"),
    ({"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:4"]}, "{'chief': 1, 'worker': 0, 'ps': 1}"),
])
def test_check_cluster_names_what_is_missing(cluster, counts):
    with pytest.raises(ClusterError, match="needs one 'chief', at least one 'worker'") as e:
        ps.check_cluster(_info(cluster))
    assert f"Received: {counts}" in str(e.value) and "HINT: " in str(e.value)


def test_local_cluster_is_rejected():
    with pytest.raises(ClusterError, match="'chief': 0, 'worker': 0, 'ps': 0"):
        ps.check_cluster(ClusterInfo(source="local", num_workers=1, worker_index=0))


def test_auto_picks_parameter_server_when_ps_tasks_exist():
    assert strategies.resolve_name("auto", _info(PS_CLUSTER), None) == "parameter_server"
    assert strategies.resolve_name("auto", _info({"worker": ["a:1", "b:2"]}), None) == (
        "multi_worker")


def test_straggler_check():
    straggler.check(0, 99, 2)  # no delay: the index does not matter
    straggler.check(50, 1, 2)
    with pytest.raises(ConfigError, match=r"must be in \[0, 2\).*Received: 2"):
        straggler.check(50, 2, 2)
    with pytest.raises(ConfigError, match="must be >= 0. Received: -1"):
        straggler.check(-1, 0, 2)


@pytest.mark.integration
def test_cli_without_ps_tasks_fails_before_tensorflow():
    env = clean_env(TF_CONFIG=json.dumps({"cluster": {"worker": ["127.0.0.1:2"]},
                                          "task": {"type": "worker", "index": 0}}))
    code = ("import sys; from tfdist.train import main; rc = main(['digits_mlp', '--strategy', "
            "'parameter_server']); assert 'tensorflow' not in sys.modules; sys.exit(rc)")
    proc = run_py(["-c", code], env=env, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "strategy parameter_server needs one 'chief'" in proc.stderr


def test_partitioning_keras_variables_is_refused_with_the_reason():
    ps.check_partitioning(0)
    ps.check_partitioning(1)
    with pytest.raises(ConfigError, match="--ps-shards 2: .*has no 'handle'.*keras-team/keras#18624"):
        ps.check_partitioning(2)


@pytest.mark.parametrize("argv, message", [
    (["--accumulate", "2"], "--accumulate does not apply to --strategy parameter_server: each "
     "worker applies its own gradients"),
    (["--deterministic"], "--deterministic does not apply to --strategy parameter_server: "
     "asynchronous steps run in whatever order"),
    (["--inter-op-threads", "1"], "--inter-op-threads does not apply to --strategy "
     "parameter_server: a worker's remote step holds an inter-op thread"),
    (["--rescale-lr-on-batch-change"], "--rescale-lr-on-batch-change does not apply to "
     "--strategy parameter_server: the coordinator resumes whole epochs"),
])
def test_options_the_coordinator_cannot_honour_are_refused_before_tensorflow(argv, message):
    from tfdist import config
    from tfdist.run import trainer

    cfg = config.merge({}, ["--strategy", "parameter_server", *argv], "recipe r")
    with pytest.raises(ConfigError) as e:
        config.check_strategy(cfg, "parameter_server", {"parameter_server"})
    assert message in str(e.value)
    # Under auto on a PS cluster too, and not under a synchronous strategy.
    auto = config.merge({}, argv, "recipe r")
    with pytest.raises(ConfigError, match="auto resolves to parameter_server here"):
        config.check_strategy(auto, "auto", strategies.possible_names("auto", _info(PS_CLUSTER),
                                                                      None))
    config.check_strategy(auto, "auto", {"single"})
    # A recipe's default is refused as well (by the adapter's check), saying what runs.
    key = argv[0][2:].replace("-", "_")
    value = cfg[key]
    recipe = config.merge({key: value}, ["--strategy", "parameter_server"], "recipe r")
    with pytest.raises(ConfigError, match="the run needs"):
        _check(recipe, _info(PS_CLUSTER))


def test_help_says_which_strategy_cannot_honour_an_option():
    from tfdist import config

    assert "not --strategy parameter_server" in config.OPTIONS["accumulate"].describe()
    assert "--strategy mirrored|model_parallel|pipeline only" in (
        config.OPTIONS["devices"].describe())
