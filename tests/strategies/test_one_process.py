"""One-process strategies refuse to start as one task of several (pure, no TensorFlow).

Before this check, `tfdist.launch -n 2 -- ... --strategy mirrored` started two
processes that each trained alone and exited 0.
"""

import json

import pytest

from tfdist import config, strategies
from tfdist.run import trainer
from tfdist.cluster import detect
from tfdist.errors import ConfigError

# pipeline takes several tasks as one stage each (tests/model_parallel/test_stages.py).
ONE_PROCESS = ("single", "mirrored", "model_parallel")
LAUNCHED = {"TF_CONFIG": json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                                     "task": {"type": "worker", "index": 1}}),
            "TFDIST_LAUNCHER": "tfdist.launch"}
SLURM = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "3",
         "SLURM_LOCALID": "0", "SLURM_STEP_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": "3"}
# (environment, how the refusal names where the tasks came from, the strategies it offers)
SOURCES = {
    "launcher": (LAUNCHED, "2 tasks started by tfdist.launch (TF_CONFIG)", "multi_worker, shm"),
    "tf_config": ({"TF_CONFIG": LAUNCHED["TF_CONFIG"]}, "2 tasks started by TF_CONFIG",
                  "multi_worker, shm"),
    "slurm": (SLURM, "3 tasks started by Slurm (SLURM_NTASKS)", "multi_worker, shm"),
    "horovodrun": ({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "4"},
                   "4 tasks started by horovodrun (HOROVOD_SIZE)", "(horovod)"),
    "mpirun": ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"},
               "2 tasks started by mpirun (OMPI_COMM_WORLD_SIZE)", "(horovod)"),
}


def _check(cfg, cluster, choice=None):
    """The run pipeline's pre-TensorFlow checks of a merged configuration."""
    from tfdist.run import trainer as run_trainer
    from tfdist.settings import Settings

    run_trainer.check_before_tensorflow(Settings.of(cfg), cluster, choice)


@pytest.mark.parametrize("name", ONE_PROCESS)
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_one_process_strategy_is_refused_as_one_task_of_several(name, source):
    environ, where, offered = SOURCES[source]
    cluster = detect(environ)
    cfg = config.merge({}, ["--strategy", name, "--devices", "2"], "recipe r")
    with pytest.raises(ConfigError) as err:
        _check(cfg, cluster)
    message = str(err.value)
    assert "\n" not in message
    assert f"--strategy {name} trains in one process, but this process is one of {where}" \
        in message, message
    assert offered in message and "each would train alone" in message


def test_parameter_server_cluster_counts_every_task_and_offers_parameter_server():
    cluster = detect({"TF_CONFIG": json.dumps({
        "cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]},
        "task": {"type": "ps", "index": 0}})})
    with pytest.raises(ConfigError, match=r"one of 3 tasks started by TF_CONFIG.*"
                                          r"\(multi_worker, shm, parameter_server\)"):
        strategies.choose("single", cluster, None).check_cluster()


@pytest.mark.parametrize("name", ONE_PROCESS)
def test_one_process_strategy_on_one_process_is_accepted(name):
    strategies.choose(name, detect({}), 2).check_cluster()
    one = {**SLURM, "SLURM_NTASKS": "1", "SLURM_STEP_TASKS_PER_NODE": "1"}
    strategies.choose(name, detect(one), 2).check_cluster()


def test_together_strategies_accept_several_tasks():
    for name in ("multi_worker", "shm", "auto"):
        strategies.choose(name, detect(LAUNCHED), None).check_cluster()


def test_multi_worker_without_a_cluster_says_it_trains_as_one_worker():
    adapter = strategies.adapter_class("multi_worker")(detect({}))
    note = adapter.startup_note()
    assert "no cluster found" in note and "trains as one worker" in note
    assert "python -m tfdist.launch -n N" in note
    launched = strategies.adapter_class("multi_worker")(detect(LAUNCHED)).startup_note()
    assert "waiting up to" in launched  # a real cluster: the start-up wait, not the note
    assert strategies.adapter_class("single")(detect({})).startup_note() is None
