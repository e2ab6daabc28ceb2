"""`horovodrun -H h0:1,h1:1` over ssh between two namespaced hosts equals one replica.

horovodrun runs on h0 (as a user would on the first machine) and starts h1's
rank over ssh (Gloo) or through mpirun's ssh launcher (MPI); every host has
its own network stack, address and hostname (tfdist.hosts), and plain `ssh h1`
works there. The final weights must equal one single-replica process's in the
same Horovod venv. Skips without the venv or namespaces, saying why, except
under CI (CI set), where that is a failure.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from tests.conftest import REPO, WORKERS, namespaced_hosts, tail
from tests.integration.test_horovod import (ATOL, COMMON, MPI_ARGS, RTOL, VENV, _env, _load,
                                            _weights, one_replica)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def venv():
    """The Horovod venv, or skip (locally) / fail (CI) with the reason."""
    if not os.access(os.path.join(VENV, "bin", "horovodrun"), os.X_OK):
        reason = (f"no Horovod venv at {VENV} (TFDIST_HOROVOD_VENV): run "
                  "scripts/install_horovod.sh")
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Horovod tests across hosts, but {reason}")
        pytest.skip(reason)
    return VENV


@pytest.fixture(scope="module")
def hosts():
    with namespaced_hosts(2, prefix="hvd") as cluster:
        yield cluster


def _worker(dump, model_dir):
    return [os.path.join(WORKERS, "hvd_train_dump.py"), dump, *COMMON, "--model-dir", model_dir]


@pytest.fixture(scope="module")
def single(venv, shared_run):
    """One replica, one process, the same venv (same TensorFlow): test_horovod's, the same
    hvd_train_dump.py command line (COMMON, --strategy single)."""
    (result,), _, _ = shared_run(one_replica)
    return result


@pytest.mark.parametrize("launcher,controller", [("horovodrun", "gloo"), ("horovodrun", "mpi"),
                                                 ("tfdist.horovodrun", "gloo")])
def test_horovodrun_over_ssh_on_two_hosts_equals_one_replica(venv, hosts, single, tmp_path,
                                                              launcher, controller):
    """tfdist.horovodrun runs h1's rank through its relay and watchdog (compat.horovodrun_grace)."""
    dump = str(tmp_path / "dump")
    head = ([os.path.join(venv, "bin", "horovodrun")] if launcher == "horovodrun" else
            [os.path.join(venv, "bin", "python"), "-m", "tfdist.horovodrun"])
    cmd = [*head, "-np", "2", "-H", "h0:1,h1:1", f"--{controller}"]
    if controller == "mpi":
        cmd.append(f"--mpi-args={MPI_ARGS}")
    cmd += [os.path.join(venv, "bin", "python"), *_worker(dump, str(tmp_path / "model")),
            "--strategy", "horovod"]
    proc = hosts.exec("h0", cmd, capture_output=True, text=True, timeout=300, env=_env(),
                      cwd=REPO)
    assert proc.returncode == 0, tail(proc)
    ranks = _load(dump)
    # One rank on each host: h1's came over ssh into its own network namespace.
    assert sorted(str(r["hostname"]) for r in ranks) == ["h0", "h1"]
    assert all(int(r["num_replicas"]) == 2 and str(r["source"]) == "horovod" for r in ranks)
    for r in ranks:
        for x, y in zip(_weights(r), _weights(single), strict=True):
            np.testing.assert_allclose(x, y, rtol=RTOL, atol=ATOL)
    # Training moved the weights: the comparison is not of two initial states.
    assert not all(np.allclose(x, y) for x, y in zip(_weights(single), _weights(single, "init")))
    # Nothing of the job is left on either host (sshd aside; ssh sessions end promptly).
    deadline = time.monotonic() + 15
    while (left := hosts.processes("h0") + hosts.processes("h1")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == []
