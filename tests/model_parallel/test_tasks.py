"""Pipeline stages across processes: layout and checks before TensorFlow (pure).

The runs themselves: tests/integration/test_pipeline_processes.py.
"""

import json

import pytest

from tfdist import config, strategies
from tfdist.run import trainer
from tfdist.cluster import detect
from tfdist.errors import ConfigError
from tfdist.model_parallel import stage_tasks as tasks


def _check(cfg, cluster, choice=None):
    """The run pipeline's pre-TensorFlow checks of a merged configuration."""
    from tfdist.run import trainer as run_trainer
    from tfdist.settings import Settings

    run_trainer.check_before_tensorflow(Settings.of(cfg), cluster, choice)


def launched(n, index=0, **extra):
    return detect({"TF_CONFIG": json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{4000 + i}" for i in range(n)], **extra},
        "task": {"type": "worker", "index": index}}), "TFDIST_LAUNCHER": "tfdist.launch"})


def check(cluster, *args):
    cfg = config.merge({}, ["--strategy", "pipeline", *args], "recipe r")
    _check(cfg, cluster)


def test_each_task_holds_one_stage_on_its_own_cpu_copy_major():
    assert tasks.stage_devices(3) == [
        "/job:worker/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:1/device:CPU:0",
        "/job:worker/replica:0/task:2/device:CPU:0"]
    assert tasks.stage_devices(2, stages=2) == tasks.stage_devices(2)
    assert tasks.layout(3) == (3, 1) and tasks.layout(6, 2) == (2, 3)
    assert tasks.layout(4, 4) == (4, 1)
    # Under tensor parallelism T each task offers T devices, its stage's shards.
    assert tasks.stage_devices(2, tensor_parallel=2) == [
        "/job:worker/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:0/device:CPU:1",
        "/job:worker/replica:0/task:1/device:CPU:0", "/job:worker/replica:0/task:1/device:CPU:1"]
    check(launched(4), "--stages", "2", "--tensor-parallel", "2")  # data x pipeline x tensor


@pytest.mark.parametrize("n,asked", [(2, 3), (6, 4), (1, 0), (4, 1)])
def test_stages_that_do_not_divide_the_tasks_are_refused_naming_both(n, asked):
    with pytest.raises(ConfigError, match=rf"--stages {asked or n} on {n} task\(s\)"):
        tasks.stage_devices(n, asked)


def test_pipeline_started_as_several_tasks_is_one_stage_each_and_only_the_chief_runs_the_loop():
    for index in (0, 1):
        check(launched(2, index), "--microbatches", "2")
    check(launched(2), "--devices", "2")  # as many as the stages (a recipe's default)
    slurm = detect({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1",
                    "SLURM_NTASKS": "3", "SLURM_LOCALID": "1", "SLURM_STEP_NODELIST": "n1",
                    "SLURM_STEP_TASKS_PER_NODE": "3"})
    check(slurm, "--stages", "3")
    adapter = strategies.adapter_class("pipeline")
    assert adapter.loop in trainer.LOOPS
    assert adapter.runs_loop(launched(2, 0)) and not adapter.runs_loop(launched(2, 1))


@pytest.mark.parametrize("args,says", [
    (["--devices", "4"], "--devices 4 splits one process's CPU"),
    (["--placement", "a=/cpu:0;b=/cpu:1"], "--placement names one process's devices"),
    (["--stages", "3"], "--stages 3 on 2 task(s)"),
    (["--stages", "1"], "--stages 1 on 2 task(s)"),
])
def test_options_without_meaning_across_processes_are_refused_before_tensorflow(args, says):
    with pytest.raises(ConfigError) as err:
        check(launched(2), *args)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_stages_in_one_process_and_clusters_without_addresses_are_refused():
    with pytest.raises(ConfigError, match="--stages 2 places stages in processes of their own"):
        check(detect({}), "--stages", "2")
    horovod = detect({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"})
    with pytest.raises(ConfigError, match="started by horovodrun.*gives none"):
        check(horovod)
    ps = detect({"TF_CONFIG": json.dumps({
        "cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]},
        "task": {"type": "chief", "index": 0}})})
    with pytest.raises(ConfigError, match="also lists 1 ps task"):
        check(ps)


def test_a_task_on_another_process_keeps_its_task_in_the_placement_table():
    from tfdist.model_parallel.placement import short_name

    assert short_name("/job:worker/replica:0/task:1/device:CPU:0") == "task:1/CPU:0"
    assert short_name("/job:localhost/replica:0/task:0/device:CPU:1") == "CPU:1"
    assert short_name("/cpu:1") == "CPU:1"


def test_the_lost_stage_is_the_first_other_task_whose_port_is_closed():
    cluster = launched(4)
    down = {"127.0.0.1:4002", "127.0.0.1:4003"}
    lost = tasks.lost_stage(cluster, reachable=lambda a: a not in down)
    assert (lost.rank, lost.address, lost.job) == (2, "127.0.0.1:4002", "pipeline stage")
    assert trainer.describe_peer_failure(lost, cluster) == "pipeline stage 2 (127.0.0.1:4002)"
    assert tasks.lost_stage(cluster, reachable=lambda a: True) is None
    # The chief's own address is never probed (it is this process).
    assert tasks.lost_stage(cluster, reachable=lambda a: a == "127.0.0.1:4001"
                             or a != "127.0.0.1:4000") is None


def test_with_copies_a_task_is_named_by_its_copy_and_stage():
    # 2 stages x 2 copies: task 2 is copy 1's stage 0; there is no "stage 2".
    assert [tasks.stage_name(t, 4, 2) for t in range(4)] == [
        ("pipeline copy 0 stage", 0), ("pipeline copy 0 stage", 1), ("pipeline copy 1 stage", 0),
        ("pipeline copy 1 stage", 1)]
    assert tasks.stage_name(3, 4) == ("pipeline stage", 3)
    cluster = launched(4)
    lost = tasks.lost_stage(cluster, reachable=lambda a: a != "127.0.0.1:4002", stages=2)
    assert trainer.describe_peer_failure(lost, cluster) == (
        "pipeline copy 1 stage 0 (127.0.0.1:4002)")


def test_a_step_is_overdue_after_the_timeout_and_never_without_one():
    assert not tasks.step_overdue(100.0, None, 60)
    assert not tasks.step_overdue(159.9, 100.0, 60)
    assert tasks.step_overdue(160.0, 100.0, 60)
    assert not tasks.step_overdue(10**6, 100.0, 0)


def test_stage_tasks_get_two_inter_op_threads_even_on_one_core_unless_asked():
    # One thread queues each forward's send behind the stage's next forwards.
    assert tasks.inter_op_threads(0, 1) == 2
    assert tasks.inter_op_threads(0, 16) == 16
    assert tasks.inter_op_threads(1, 1) == 1  # --inter-op-threads 1 is kept
    assert tasks.inter_op_threads(3, 16) == 3


def test_the_hung_stage_is_the_first_other_task_that_does_not_answer_an_op():
    cluster = launched(3)
    asked = []

    def answers(device, timeout_s):
        asked.append((device, timeout_s))
        return not device.endswith("task:2/device:CPU:0")

    lost = tasks.hung_stage(cluster, 5.0, answers=answers)
    assert (lost.rank, lost.address, lost.job) == (2, "127.0.0.1:4002", "pipeline stage")
    assert [d for d, _ in asked] == [tasks.task_device(1), tasks.task_device(2)]  # not self
    assert tasks.hung_stage(cluster, 5.0, answers=lambda d, t: True) is None


def test_the_watchdog_keeps_watching_after_a_step_and_an_epoch_until_training_ends():
    # The backup callback runs after the watchdog's and reads every stage's
    # variables: a stage stopped during a backup must still be found.
    dog = tasks.watchdog(launched(2), timeout_s=60)
    assert dog.started is None
    dog.on_train_batch_begin(0)
    begun = dog.started
    dog.on_train_batch_end(0)
    assert dog.started is not None and dog.started >= begun
    dog.on_epoch_end(0)
    assert dog.started is not None
    dog.on_train_end()
    assert dog.started is None


@pytest.mark.parametrize("batch, copies, m, says", [
    (68, 2, 4, "--global-batch-size 68 cannot be cut into 2 data-parallel copies x 4 "
               "micro-batches (8 equal parts): each copy takes an equal share of every batch "
               "and cuts it into equal micro-batches. Pass a --global-batch-size that is a "
               "multiple of 8 (64 or 72), or --microbatches 2."),
    (33, 2, 1, "--global-batch-size 33 cannot be cut into 2 data-parallel copies (2 equal "
               "parts)"),
    (30, 1, 4, "into 4 micro-batches (4 equal parts)"),
])
def test_a_batch_that_copies_and_micro_batches_cannot_share_is_refused_saying_what_fits(
        batch, copies, m, says):
    with pytest.raises(ConfigError) as e:
        tasks.check_batch(batch, copies, m)
    assert says in str(e.value)
    assert tasks.check_batch(64, 2, 4) == 8


@pytest.mark.parametrize("n, args, says", [
    (4, ["--stages", "2", "--microbatches", "4", "--global-batch-size", "68"], "68 cannot"),
    (4, ["--stages", "2", "--global-batch-size", "33"], "33 cannot"),
])
def test_every_task_refuses_a_bad_split_before_tensorflow(n, args, says):
    for index in range(n):
        with pytest.raises(ConfigError, match=says):
            check(launched(n, index), *args)


def test_a_model_too_small_for_the_processes_gets_advice_in_processes_and_stages():
    # -n 3, a model of at most 2 stages: 3 has no divisor that fits; start 2.
    line = tasks.too_many_stages(3, 3, 2)
    assert line.startswith("Cannot split the model into 3 stages: it can be cut into at "
                           "most 2, and across processes each of the 3 tasks holds one stage.")
    assert "Start 2 processes (python -m tfdist.launch -n 2 -- ...)." in line
    assert "--devices" not in line and "--placement" not in line and "--stages" not in line
    # -n 4: --stages 2 keeps the 4 processes as 2 copies.
    assert ("or keep 4 processes with --stages 2 (2 data-parallel copies of 2 stages)"
            in tasks.too_many_stages(4, 4, 2))
    assert "Train it in one process" in tasks.too_many_stages(2, 2, 1)
