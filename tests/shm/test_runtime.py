"""Building the shm communicator from the cluster: addresses, and refusing remote workers."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.conftest import WORKERS, clean_env, run_py, tail
from tfdist import exit_codes
from tfdist.cluster.base import ClusterInfo
from tfdist.errors import ClusterError
from tfdist.shm import runtime


def _cluster(workers, index=0, chief=None):
    spec = {"worker": workers, **({"chief": chief} if chief else {})}
    n = len(workers) + len(chief or [])
    return ClusterInfo("tf_config", n, index, tf_config={"cluster": spec,
                                                         "task": {"type": "worker", "index": 0}})


def test_rendezvous_is_worker_zero():
    assert runtime.rendezvous_address(_cluster(["127.0.0.1:2001", "127.0.0.1:2002"])) == (
        "127.0.0.1", 2001)
    # With a chief, the chief is worker 0.
    assert runtime.rendezvous_address(
        _cluster(["localhost:2002"], chief=["localhost:2001"])) == ("localhost", 2001)


def test_remote_workers_are_refused_with_a_hint():
    with pytest.raises(ClusterError, match=r"workers \['10.255.0.7:2002'\] are on other hosts"):
        runtime.rendezvous_address(_cluster(["127.0.0.1:2001", "10.255.0.7:2002"]))


def test_is_local_host():
    assert runtime.is_local_host("127.0.0.1") and runtime.is_local_host("localhost")
    assert not runtime.is_local_host("192.0.2.1")  # TEST-NET-1, never this machine


def test_communicator_before_init_says_what_to_do():
    with pytest.raises(RuntimeError, match="call tfdist.shm.init"):
        runtime.communicator()


@pytest.mark.integration
def test_cli_refuses_shm_across_hosts(tmp_path):
    tf_config = {"cluster": {"worker": ["127.0.0.1:2001", "192.0.2.1:2002"]},
                 "task": {"type": "worker", "index": 0}}
    proc = run_py(["-m", "tfdist.train", "digits_mlp", "--strategy", "shm", "--model-dir",
                   str(tmp_path)], env=clean_env(TF_CONFIG=json.dumps(tf_config)), timeout=120)
    assert proc.returncode == exit_codes.CLUSTER, proc.stderr[-2000:]
    assert "are on other hosts" in proc.stderr and "HINT: use --strategy multi_worker" in proc.stderr
    assert "cuInit" not in proc.stderr and "oneDNN" not in proc.stderr  # before TensorFlow


def test_shm_hooks_add_the_goyal_warmup_only_when_asked():
    from tfdist.horovod.callbacks import LearningRateWarmup
    from tfdist.strategies.shm import ShmHooks

    hooks = ShmHooks(_cluster(["127.0.0.1:2001", "127.0.0.1:2002"]))
    assert not any(isinstance(c, LearningRateWarmup)
                   for c in hooks.callbacks(0.2, warmup_epochs=0.0))
    (warmup,) = [c for c in hooks.callbacks(0.2, warmup_epochs=2.0)
                 if isinstance(c, LearningRateWarmup)]
    assert (warmup.initial_lr, warmup.size, warmup.warmup_epochs) == (0.1, 2, 2.0)


@pytest.mark.integration
def test_tensorflow_op_fuses_small_tensors_and_matches_numpy(tmp_path):
    from tests.workers.shm_ops import tensors

    proc = run_py(["-m", "tfdist.launch", "-n", "2", "--timeout", "120", "--", "python",
                   os.path.join(WORKERS, "shm_ops.py"), str(tmp_path)], timeout=180)
    assert proc.returncode == 0, tail(proc)
    xs = [tensors(r) for r in (0, 1)]
    for r in (0, 1):
        got = dict(np.load(tmp_path / f"rank{r}.npz"))
        # float32 small ones: one bucket; the 40 KB one alone; int32s: one bucket.
        assert int(got["buckets"]) == 3
        for k in xs[0]:
            total = xs[0][k] + xs[1][k]
            np.testing.assert_array_equal(got[f"sum_{k}"], total)
            want = total // 2 if total.dtype.kind == "i" else total * np.float32(0.5)
            np.testing.assert_array_equal(got[f"mean_{k}"], want)
