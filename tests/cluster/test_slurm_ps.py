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
