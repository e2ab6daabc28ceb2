"""Slurm ranks mapped to chief / ps / worker roles (TFDIST_NUM_PS)."""

import pytest

from tfdist.cluster import detect, ports, slurm
from tfdist.errors import ClusterError


def test_ps_roles():
    assert slurm.ps_roles(5, 2) == [("chief", 0), ("ps", 0), ("ps", 1), ("worker", 0),
                                    ("worker", 1)]
    with pytest.raises(ClusterError, match="SLURM_NTASKS=2, TFDIST_NUM_PS=1"):
        slurm.ps_roles(2, 1)


def _env(procid, num_ps="1"):
    return dict(SLURM_JOB_ID="7", SLURM_PROCID=str(procid), SLURM_NTASKS="4",
                SLURM_LOCALID=str(procid % 2), SLURM_STEP_ID="0", SLURM_STEP_NODELIST="n[1-2]",
                SLURM_STEP_TASKS_PER_NODE="2(x2)", TFDIST_NUM_PS=num_ps)


def test_slurm_step_becomes_a_ps_cluster():
    infos = [detect(_env(r)) for r in range(4)]
    assert [(i.task_type, i.task_index) for i in infos] == [
        ("chief", 0), ("ps", 0), ("worker", 0), ("worker", 1)]
    p = ports.derived_base(7, 0)
    assert infos[2].tf_config["cluster"] == {"chief": [f"n1:{p}"], "ps": [f"n1:{p + 1}"],
                                             "worker": [f"n2:{p}", f"n2:{p + 1}"]}
    assert infos[0].is_chief and not infos[1].is_chief and infos[3].hostname == "n2"


def test_bad_num_ps():
    with pytest.raises(ClusterError, match="TFDIST_NUM_PS must be an integer in 0-2147483647. Received: TFDIST_NUM_PS='two'"):
        detect(_env(0, "two"))
    assert detect(_env(1, "0")).task_type == "worker"  # 0: plain synchronous workers


def test_readme_slurm_ps_row_as_written_makes_a_ps_cluster():
    import shlex

    from tests.integration.test_launch_table import launch_table_commands

    (row,) = [c for c in launch_table_commands() if "srun" in c and "parameter_server" in c]
    words = shlex.split(row)
    env = {}
    while "=" in words[0]:  # the shell's NAME=value prefix
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    srun = words[:words.index("python")]
    assert srun[0] == "srun" and "-n" in srun, row  # a bare srun is one task: no ps cluster
    ntasks = int(srun[srun.index("-n") + 1])
    # Slurm gives each task a CPU of its own: without --overcommit, 3 tasks on a
    # 2-core node (this machine's one-node cluster) stay pending.
    assert "--overcommit" in srun, row
    infos = [detect({**env, "SLURM_JOB_ID": "7", "SLURM_PROCID": str(r),
                     "SLURM_NTASKS": str(ntasks), "SLURM_LOCALID": str(r), "SLURM_STEP_ID": "0",
                     "SLURM_STEP_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": str(ntasks)})
             for r in range(ntasks)]
    assert [(i.task_type, i.task_index) for i in infos] == [("chief", 0), ("ps", 0),
                                                            ("worker", 0)]
