"""Horovod rank discovery from horovodrun's (Gloo) and mpirun's (MPI) variables."""

import pytest

from tfdist.cluster import detect
from tfdist.cluster.horovod import HorovodEnvironment
from tfdist.errors import ClusterError


def test_gloo_variables():
    info = detect({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1",
                   "HOROVOD_HOSTNAME": "localhost"})
    assert (info.source, info.num_workers, info.worker_index, info.local_rank) == (
        "horovod", 4, 1, 1)
    assert not info.is_chief and info.is_multi_worker and info.tf_config is None
    assert info.hostname == "localhost"


def test_mpi_variables_rank0_is_chief():
    info = detect({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
                   "OMPI_COMM_WORLD_LOCAL_RANK": "0"})
    assert (info.source, info.num_workers, info.worker_index, info.is_chief) == (
        "horovod", 2, 0, True)


def test_order_tf_config_wins_and_horovod_beats_slurm():
    slurm = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    assert detect({**slurm, "HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}).source == "horovod"
    tf_config = '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}'
    assert detect({"TF_CONFIG": tf_config, "HOROVOD_RANK": "0",
                   "HOROVOD_SIZE": "2"}).source == "tf_config"


def test_local_rank_defaults_to_zero_and_size_alone_is_not_horovod():
    assert detect({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "1"}).local_rank == 0
    assert not HorovodEnvironment.detect({"HOROVOD_SIZE": "2"})


@pytest.mark.parametrize("env, message", [
    ({"HOROVOD_RANK": "2", "HOROVOD_SIZE": "2"}, r"HOROVOD_RANK=2 is out of range for "
                                                 r"HOROVOD_SIZE=2"),
    ({"HOROVOD_RANK": "x", "HOROVOD_SIZE": "2"}, r"HOROVOD_RANK must be an integer in "
                                                 r"0-2147483647\. Received: HOROVOD_RANK='x'"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "0"}, "out of range"),
    # Issue 13: these made a lone chief (and switched Slurm detection off), or escaped raw.
    ({"HOROVOD_RANK": "1"}, r"incomplete or mixed: \{'HOROVOD_RANK': '1'\}"),
    ({"HOROVOD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, r"incomplete or mixed"),
    ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1",
      "OMPI_COMM_WORLD_SIZE": "2"}, r"Horovod and MPI variables disagree: HOROVOD_RANK/"
                                    r"HOROVOD_SIZE=0/2 but OMPI_COMM_WORLD_RANK/"
                                    r"OMPI_COMM_WORLD_SIZE=1/2"),
    ({"HOROVOD_RANK": "²", "HOROVOD_SIZE": "4"}, r"HOROVOD_RANK must be an integer .*'²'"),
    ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "٣"}, r"HOROVOD_SIZE must be an integer"),
    ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "9" * 5000}, r"HOROVOD_SIZE must be an integer .*"
                                                        r"Received: HOROVOD_SIZE='9999"),
    ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "2"},
     r"HOROVOD_LOCAL_RANK=2 is out of range"),
])
def test_bad_values_say_what_was_received(env, message):
    with pytest.raises(ClusterError, match=message) as e:
        detect(env)
    assert "\nHINT: " in str(e.value)


def test_both_families_agreeing_is_fine():
    info = detect({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1",
                   "OMPI_COMM_WORLD_SIZE": "2"})
    assert (info.worker_index, info.num_workers) == (1, 2)


def test_forced_horovod_source_must_be_present():
    with pytest.raises(ClusterError, match="'horovod' was requested"):
        detect({}, source="horovod")
