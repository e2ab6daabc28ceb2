"""horovodrun kills ranks 5 s after a SIGTERM (tfdist.compat.horovodrun_grace).

The integration tests run the same preempted Horovod job twice, under Horovod's
own horovodrun and under `python -m tfdist.horovodrun`: 2 ranks of a slowed
digits_mlp (about 0.3 s a step) that agree on a SIGTERM only every 40 steps,
so the agreed step is more than 5 s after the signal.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import time

import pytest

from tests.conftest import REPO, WORKERS, namespaced_hosts, run_py, wait_for_checkpoint
from tests.integration.test_horovod import _env, venv  # noqa: F401 (venv: the fixture)
from tfdist import exit_codes, horovodrun


def test_grace_flag_is_parsed_first_and_checked():
    assert horovodrun.parse(["-np", "2", "python", "x.py"]) == (60.0, ["-np", "2", "python",
                                                                      "x.py"])
    assert horovodrun.parse(["--grace-s", "90", "-np", "2"]) == (90.0, ["-np", "2"])
    assert horovodrun.parse(["--grace-s=7.5", "-np", "2"]) == (7.5, ["-np", "2"])
    for bad in (["--grace-s"], ["--grace-s", "0"], ["--grace-s=soon"]):
        with pytest.raises(SystemExit) as e:
            horovodrun.parse(bad)
        assert e.value.code == 2


def test_apply_refuses_a_grace_that_is_not_positive():
    from tfdist.compat import horovodrun_grace

    with pytest.raises(ValueError, match="Received: -1"):
        horovodrun_grace.apply(-1)


@pytest.mark.integration
def test_without_horovod_it_says_where_to_get_it():
    proc = run_py(["-c", "import sys, tfdist.horovodrun as h; sys.modules['horovod'] = None; "
                         "sys.exit(h.main(['-np', '2', 'true']))"], timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Horovod is not installed" in proc.stderr and "install_horovod.sh" in proc.stderr


def _preempted_job(venv_dir: str, tmp_path, launcher: list[str], hosts=None):
    """(status rank 0 wrote or None, backups, output) of a job SIGTERMed after its first backup.

    With `hosts` (a namespaced cluster), horovodrun runs on h0 and rank 1 on h1 over ssh.
    """
    model_dir, status = str(tmp_path / "model"), str(tmp_path / "status")
    python = os.path.join(venv_dir, "bin", "python")
    where = "h0:1,h1:1" if hosts else "localhost:2"
    cmd = [*launcher, "-np", "2", "-H", where, "--gloo", python, "-m", "tfdist.train",
           os.path.join(WORKERS, "slow_digits.py"), "--strategy", "horovod", "--epochs", "2",
           "--global-batch-size", "64", "--verbose", "0", "--threads", "1",
           "--example-delay-ms", "5", "--save-every-steps", "4", "--preempt-check-steps", "40",
           "--model-dir", model_dir, "--status-file", status]
    popen = functools.partial(hosts.popen, "h0") if hosts else subprocess.Popen
    proc = popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_for_checkpoint(model_dir, lambda: proc.poll() is None, 180, "the Horovod job")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    written = open(status).read().strip() if os.path.exists(status) else None
    return written, sorted(os.listdir(os.path.join(model_dir, "backup"))), out


@pytest.mark.integration
def test_plain_horovodrun_kills_ranks_before_the_agreed_step(venv, tmp_path):
    """The upstream behaviour: SIGKILL 5 s after SIGTERM, no backup at the agreed step."""
    status, backups, out = _preempted_job(venv, tmp_path, [os.path.join(venv, "bin",
                                                                         "horovodrun")])
    assert status != str(exit_codes.PREEMPTED), out[-3000:]
    assert "ckpt-0000000040.npz" not in backups and "preempted" not in out, out[-3000:]


@pytest.mark.integration
def test_tfdist_horovodrun_lets_the_ranks_save_at_the_agreed_step(venv, tmp_path):
    status, backups, out = _preempted_job(
        venv, tmp_path, [os.path.join(venv, "bin", "python"), "-m", "tfdist.horovodrun"])
    assert status == str(exit_codes.PREEMPTED), out[-3000:]
    assert "preempted by signal 15 at global step 40" in out, out[-3000:]
    assert backups[-1] == "ckpt-0000000040.npz", backups
    assert "Traceback" not in out, out[-3000:]  # a failed rank is one line, not a traceback


@pytest.fixture(scope="module")
def hosts():
    with namespaced_hosts(2, prefix="hgr") as cluster:
        yield cluster


@pytest.mark.integration
def test_plain_horovodrun_gives_a_rank_on_another_host_no_time_at_all(venv, hosts, tmp_path):
    """Upstream across hosts: the remote rank's ssh is terminated, the rank is gone at once,
    and the chief reports a lost peer with only a periodic backup."""
    status, backups, out = _preempted_job(venv, tmp_path, [os.path.join(venv, "bin",
                                                                         "horovodrun")], hosts)
    assert status == str(exit_codes.PEER_LOST), out[-3000:]
    assert "ckpt-0000000040.npz" not in backups and "preempted" not in out, out[-3000:]


@pytest.mark.integration
def test_tfdist_horovodrun_lets_a_rank_on_another_host_save_too(venv, hosts, tmp_path):
    status, backups, out = _preempted_job(
        venv, tmp_path, [os.path.join(venv, "bin", "python"), "-m", "tfdist.horovodrun"], hosts)
    assert status == str(exit_codes.PREEMPTED), out[-3000:]
    # Both ranks got the signal and agreed: h1's through its ssh session, kept open.
    for rank in (0, 1):
        assert f"[{rank}]<stderr>:tfdist: preempted by signal 15 at global step 40" in out, out
    assert backups[-1] == "ckpt-0000000040.npz", backups
    deadline = time.monotonic() + 15  # nothing of the job left on either host (sshd aside)
    while (left := hosts.processes("h0") + hosts.processes("h1")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == []
