"""SLURM discovery from `srun` variables, with a cleared environment."""

import pytest

from tfdist.cluster import detect
from tfdist.cluster.slurm import (expand_hostlist, expand_tasks_per_node, port_base_for_job,
                                  slurm_tf_config)
from tfdist.errors import ClusterError


@pytest.mark.parametrize("text, hosts", [
    ("node1", ["node1"]),
    ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
    ("a,b,c", ["a", "b", "c"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("r[1-2]-n[1-2]", ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]),
    ("gpu[001-002],cpu[1,3]", ["gpu001", "gpu002", "cpu1", "cpu3"]),
])
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["node[1-", "node]1[", "node[a-b]", "node[3-1]", ""])
def test_expand_hostlist_rejects(text):
    with pytest.raises(ValueError):
        expand_hostlist(text)


@pytest.mark.parametrize("text, counts", [
    ("1", [1]), ("2(x3),1", [2, 2, 2, 1]), ("4,2(x2)", [4, 2, 2])])
def test_expand_tasks_per_node(text, counts):
    assert expand_tasks_per_node(text) == counts


def test_expand_tasks_per_node_rejects():
    with pytest.raises(ValueError, match=r"bad entry '2\(3\)'"):
        expand_tasks_per_node("2(3)")


def _srun_env(procid, localid, node, **over):
    env = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(procid),
           "SLURM_NTASKS": "5", "SLURM_LOCALID": str(localid),
           "SLURM_STEP_NODELIST": "node[01-02],gpu5", "SLURM_STEP_TASKS_PER_NODE": "2(x2),1",
           "SLURMD_NODENAME": node}
    env.update(over)
    return env


def test_srun_task_gets_block_layout_and_job_ports():
    base = port_base_for_job(4242)
    info = detect(_srun_env(3, 1, "node02"))
    assert (info.source, info.num_workers, info.worker_index, info.local_rank) == (
        "slurm", 5, 3, 1)
    assert not info.is_chief and info.hostname == "node02"
    assert info.tf_config == {
        "cluster": {"worker": [f"node01:{base}", f"node01:{base + 1}", f"node02:{base}",
                               f"node02:{base + 1}", f"gpu5:{base}"]},
        "task": {"type": "worker", "index": 3}}
    assert detect(_srun_env(0, 0, "node01")).is_chief


def test_two_jobs_on_a_node_get_different_ports():
    a, b = port_base_for_job(100), port_base_for_job(101)
    assert a != b and abs(a - b) >= 20
    assert slurm_tf_config(["n"], [2], a)["cluster"]["worker"] == [f"n:{a}", f"n:{a + 1}"]


def test_port_base_override():
    info = detect(_srun_env(0, 0, "node01", TFDIST_PORT_BASE="30000"))
    assert info.tf_config["cluster"]["worker"][0] == "node01:30000"


def test_single_task_step_has_no_tf_config():
    env = _srun_env(0, 0, "node01", SLURM_NTASKS="1", SLURM_STEP_NODELIST="node01",
                    SLURM_STEP_TASKS_PER_NODE="1")
    info = detect(env)
    assert info.num_workers == 1 and info.tf_config is None and info.is_chief


def test_tf_config_wins_over_slurm():
    env = _srun_env(0, 0, "node01", TF_CONFIG='{"cluster": {"worker": ["a:1"]}, '
                                              '"task": {"type": "worker", "index": 0}}')
    assert detect(env).source == "tf_config"


@pytest.mark.parametrize("over, message", [
    ({"SLURM_NTASKS": "4"}, r"adds up to 5 but SLURM_NTASKS=4"),
    ({"SLURM_STEP_TASKS_PER_NODE": "2,3"}, r"names 3 node\(s\) but tasks-per-node '2,3' gives 2"),
    ({"SLURM_STEP_NODELIST": "node[01-"}, r"Cannot parse the SLURM node layout"),
    ({"SLURM_PROCID": "x"}, r"SLURM_PROCID must be a non-negative integer. Received: 'x'"),
    ({"SLURM_LOCALID": "0"}, r"local task 0, but block distribution puts it on node02 as "
                             r"local task 1"),
    ({"SLURMD_NODENAME": "node01"}, r"runs on node01 .*puts it on node02"),
    ({"SLURM_STEP_ID": None}, r"SLURM_NTASKS=5 but this process is the batch script"),
])
def test_bad_slurm_env_is_explained(over, message):
    env = _srun_env(3, 1, "node02")
    for k, v in over.items():
        if v is None:
            env.pop(k)
        else:
            env[k] = v
    with pytest.raises(ClusterError, match=message):
        detect(env)


def test_missing_nodelist_hints_srun():
    env = _srun_env(3, 1, "node02")
    del env["SLURM_STEP_NODELIST"]
    with pytest.raises(ClusterError, match=r"SLURM_STEP_NODELIST / SLURM_JOB_NODELIST.*"
                                           r"\nHINT: start every worker with `srun`"):
        detect(env)


def test_no_nvidia_smi_needed(monkeypatch):
    # TF's SlurmClusterResolver runs nvidia-smi; discovery here must not spawn anything.
    import subprocess

    def boom(*a, **k):
        raise AssertionError("discovery must not run subprocesses")

    monkeypatch.setattr(subprocess, "Popen", boom)
    monkeypatch.setattr(subprocess, "run", boom)
    assert detect(_srun_env(3, 1, "node02")).num_workers == 5


def test_salloc_shell_without_srun_is_explained():
    # In an `salloc -n 2` shell there is a job and a task count but no task id:
    # training there would silently run alone.
    env = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "vm",
           "SLURM_TASKS_PER_NODE": "2"}
    with pytest.raises(ClusterError, match=r"SLURM_NTASKS=2 but this process is the "
                                           r"allocation's shell \(salloc\).*\nHINT: launch "
                                           r"with `srun"):
        detect(env)


def test_single_task_allocation_shell_is_local():
    env = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1", "SLURM_JOB_NODELIST": "vm"}
    assert detect(env).source == "local"
    assert detect({"SLURM_JOB_ID": "7"}).source == "local"


@pytest.mark.parametrize("rank_var", ["HOROVOD_RANK", "OMPI_COMM_WORLD_RANK"])
def test_ranks_of_horovodrun_inside_a_batch_job_are_not_slurm_tasks(rank_var):
    # slurm/horovod.sbatch runs horovodrun from the batch shell: its ranks inherit
    # SLURM_PROCID=0 and SLURM_NTASKS=2 without a step, which must not read as misuse.
    env = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_PROCID": "0",
           "SLURM_JOB_NODELIST": "vm", "SLURM_TASKS_PER_NODE": "2", rank_var: "1"}
    assert detect(env).source != "slurm"
    del env[rank_var]
    with pytest.raises(ClusterError, match="this process is the batch script itself"):
        detect(env)
