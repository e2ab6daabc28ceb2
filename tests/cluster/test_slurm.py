"""SLURM discovery from `srun` variables, with a cleared environment."""

import pytest

from tfdist.cluster import detect
from tfdist.cluster import ports
from tfdist.cluster.slurm import expand_hostlist, expand_tasks_per_node, slurm_tf_config
from tfdist.errors import ClusterError


@pytest.mark.parametrize("text, hosts", [
    ("node1", ["node1"]),
    ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
    ("a,b,c", ["a", "b", "c"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("r[1-2]-n[1-2]", ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]),
    ("gpu[001-002],cpu[1,3]", ["gpu001", "gpu002", "cpu1", "cpu3"]),
    ("a b\tc", ["a", "b", "c"]),  # Slurm also splits on spaces and tabs
    ("n[0-65535]", [f"n{i}" for i in range(65536)]),  # Slurm's largest range
])
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text, message", [
    ("node[1-", "unbalanced"), ("node]1[", "unbalanced"), ("node[a-b]", "bad range"),
    ("node[3-1]", "descending"), ("", "empty"), ("n[]", "bad range"), ("n[[1]]", "nested"),
    ("n[1-2]x", "text after its last ']', which Slurm rejects"),  # as Slurm does
    ("n[0-70000]", "more than 65536 hosts \\(Slurm's limit\\)"),
    ("a[0-999]b[0-999]", "names more than 65536 hosts"),
    ("nodé1", "characters other than"), ("n[1-٣]", "bad range"),
])
def test_expand_hostlist_rejects(text, message):
    with pytest.raises(ValueError, match=message):
        expand_hostlist(text)


@pytest.mark.parametrize("text, counts", [
    ("1", [1]), ("2(x3),1", [2, 2, 2, 1]), ("4,2(x2)", [4, 2, 2])])
def test_expand_tasks_per_node(text, counts):
    assert expand_tasks_per_node(text) == counts


def test_expand_tasks_per_node_rejects():
    with pytest.raises(ValueError, match=r"bad entry '2\(3\)'"):
        expand_tasks_per_node("2(3)")
    with pytest.raises(ValueError, match=r"describes more than 65536 node"):
        expand_tasks_per_node("1(x1000000000000)")  # once a MemoryError
    with pytest.raises(ValueError, match=r"bad entry '²'"):
        expand_tasks_per_node("²")


def _srun_env(procid, localid, node, **over):
    env = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(procid),
           "SLURM_NTASKS": "5", "SLURM_LOCALID": str(localid),
           "SLURM_STEP_NODELIST": "node[01-02],gpu5", "SLURM_STEP_TASKS_PER_NODE": "2(x2),1",
           "SLURMD_NODENAME": node}
    env.update(over)
    return env


def test_srun_task_gets_block_layout_and_job_ports():
    base = ports.derived_base(4242, 0)
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
    a, b = ports.derived_base(100, 0), ports.derived_base(101, 0)
    assert a != b and abs(a - b) >= 20
    assert slurm_tf_config(["n"], [2], a)["cluster"]["worker"] == [f"n:{a}", f"n:{a + 1}"]


def _blocks(pairs):
    return [set(range(ports.derived_base(j, s), ports.derived_base(j, s) + ports.SPAN))
            for j, s in pairs]


def test_derived_ports_differ_per_step_and_job_and_avoid_the_ephemeral_range():
    # Concurrent steps 0-3 of a job, and jobs up to JOB_SLOTS-1 ids apart, never share a port.
    for first in (0, 7, 2000, 4242, 2**32 - 300):
        pairs = [(first + d, s) for d in range(ports.JOB_SLOTS) for s in range(ports.STEP_SLOTS)]
        blocks = _blocks(pairs)
        assert sum(len(b) for b in blocks) == len(set().union(*blocks))
    # Jobs 2000 apart once collided (2000 job slots); two steps of one job always did.
    assert not set.intersection(*_blocks([(5, 0), (2005, 0)]))
    assert not set.intersection(*_blocks([(5, 0), (5, 1)]))
    lo, hi = ports.EPHEMERAL
    for job in range(0, 100_000, 37):
        for step in range(6):
            base = ports.derived_base(job, step)
            assert 1024 <= base and base + ports.SPAN - 1 < lo


def test_step_id_changes_the_ports():
    a = detect(_srun_env(0, 0, "node01")).tf_config["cluster"]["worker"]
    b = detect(_srun_env(0, 0, "node01", SLURM_STEP_ID="1")).tf_config["cluster"]["worker"]
    assert not set(a) & set(b)


def test_port_base_override():
    info = detect(_srun_env(0, 0, "node01", TFDIST_PORT_BASE="30000"))
    assert info.tf_config["cluster"]["worker"][:2] == ["node01:30000", "node01:30001"]


def test_slurm_reserved_ports_are_used():
    info = detect(_srun_env(3, 1, "node02", SLURM_STEP_RESV_PORTS="12000-12001"))
    assert info.tf_config["cluster"]["worker"] == [
        "node01:12000", "node01:12001", "node02:12000", "node02:12001", "gpu5:12000"]


@pytest.mark.parametrize("over, message", [
    ({"TFDIST_PORT_BASE": "0"}, r"TFDIST_PORT_BASE=0: ports 0-1 are needed for 2 task\(s\) per "
                                r"node, but ports must be in 1024-65535"),
    ({"TFDIST_PORT_BASE": "65535"}, r"TFDIST_PORT_BASE=65535: ports 65535-65536"),
    ({"TFDIST_PORT_BASE": "70000"}, r"TFDIST_PORT_BASE must be an integer in 0-65535\. "
                                    r"Received: TFDIST_PORT_BASE='70000'"),
    ({"TFDIST_PORT_BASE": "３０００"}, r"TFDIST_PORT_BASE must be an integer"),
    ({"SLURM_STEP_RESV_PORTS": "12000"}, r"reserves 1 port\(s\) but the step runs 2 task"),
    ({"SLURM_STEP_RESV_PORTS": "x"}, r"SLURM_STEP_RESV_PORTS='x' is not a port list"),
])
def test_bad_ports_are_explained(over, message):
    with pytest.raises(ClusterError, match=message) as e:
        detect(_srun_env(0, 0, "node01", **over))
    assert "HINT:" in str(e.value)


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
    ({"SLURM_PROCID": "x"}, r"SLURM_PROCID must be an integer in 0-2147483647\. Received: "
                            r"SLURM_PROCID='x'"),
    ({"SLURM_PROCID": "٣"}, r"SLURM_PROCID must be an integer"),
    ({"SLURM_JOB_ID": "9" * 5000}, r"SLURM_JOB_ID must be an integer in 0-4294967295\. "
                                   r"Received: SLURM_JOB_ID='9999"),
    ({"SLURM_STEP_TASKS_PER_NODE": "1(x1000000000000)"}, r"describes more than 65536 node"),
    ({"SLURM_STEP_NODELIST": "n[1-2]x"}, r"which Slurm rejects"),
    ({"TFDIST_NUM_PS": "-1"}, r"TFDIST_NUM_PS must be an integer"),
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
           "SLURM_JOB_NODELIST": "vm", "SLURM_TASKS_PER_NODE": "2", rank_var: "1",
           rank_var.replace("RANK", "SIZE"): "2"}
    assert detect(env).source == "horovod"
    del env[rank_var], env[rank_var.replace("RANK", "SIZE")]
    with pytest.raises(ClusterError, match="this process is the batch script itself"):
        detect(env)
