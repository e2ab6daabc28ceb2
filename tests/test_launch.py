"""The local launcher, with plain Python workers (no TensorFlow)."""

import sys

import pytest

from tests.conftest import run_py

from tfdist import exit_codes, launch
from tfdist.launch.plan import job_status


def test_worker_tf_configs():
    configs = launch.worker_tf_configs([1000, 1001])
    assert configs[1] == {"cluster": {"worker": ["127.0.0.1:1000", "127.0.0.1:1001"]},
                          "task": {"type": "worker", "index": 1}}


def test_free_ports_are_distinct_loopback_ports():
    ports = launch.free_ports(4)
    assert len(set(ports)) == 4 and all(1024 <= p < 65536 for p in ports)


@pytest.mark.integration
def test_each_worker_gets_its_tf_config_and_prefixed_output():
    code = ("import os, json; c = json.loads(os.environ['TF_CONFIG']); "
            "print('index', c['task']['index'], 'of', len(c['cluster']['worker']))")
    proc = run_py(["-m", "tfdist.launch", "-n", "3", "--", sys.executable, "-c", code], timeout=60)
    assert proc.returncode == 0, proc.stderr
    for i in range(3):
        assert f"[worker {i}] index {i} of 3" in proc.stdout


def test_core_sets_are_disjoint_even_shares():
    assert launch.core_sets([0, 1], 2) == [[0], [1]]
    assert launch.core_sets(list(range(8)), 3) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert launch.core_sets([2, 5, 7, 9], 1) == [[2, 5, 7, 9]]
    assert launch.core_sets([0, 1], 3) == [[0], [1], [0]]  # more workers than cores: shared
    with pytest.raises(ValueError):
        launch.core_sets([], 2)


@pytest.mark.integration
def test_cpu_bind_cores_gives_each_worker_its_own_share():
    import os

    cpus = sorted(os.sched_getaffinity(0))
    code = ("import os, json; i = json.loads(os.environ['TF_CONFIG'])['task']['index']; "
            "print('cpus', i, sorted(os.sched_getaffinity(0)))")
    proc = run_py(["-m", "tfdist.launch", "-n", "2", "--cpu-bind", "cores", "--", sys.executable,
                   "-c", code], timeout=60)
    assert proc.returncode == 0, proc.stderr
    for i, share in enumerate(launch.core_sets(cpus, 2)):
        assert f"[worker {i}] cpus {i} {share}" in proc.stdout, proc.stdout
    proc = run_py(["-m", "tfdist.launch", "-n", "2", "--", sys.executable, "-c", code], timeout=60)
    assert f"[worker 0] cpus 0 {cpus}" in proc.stdout, proc.stdout  # default: not bound
    proc = run_py(["-m", "tfdist.launch", "--ps", "1", "--workers", "1", "--cpu-bind", "cores",
                   "--", "true"], timeout=30)
    assert proc.returncode == 2 and "--cpu-bind applies to -n and --hosts workers" in proc.stderr


@pytest.mark.integration
def test_failing_worker_stops_the_others_and_is_named():
    code = ("import os, json, sys, time; i = json.loads(os.environ['TF_CONFIG'])['task']['index']; "
            "sys.exit(7) if i == 1 else time.sleep(60)")
    proc = run_py(["-m", "tfdist.launch", "-n", "2", "--", sys.executable, "-c", code], timeout=40)
    assert proc.returncode == 1
    assert "tfdist.launch: worker 1 failed (exit code 7); stopping the other 1 worker(s)." in (
        proc.stderr)


@pytest.mark.integration
def test_killed_worker_is_reported_by_signal():
    code = ("import os, json, signal, time; "
            "i = json.loads(os.environ['TF_CONFIG'])['task']['index']; "
            "os.kill(os.getpid(), signal.SIGKILL) if i == 0 else time.sleep(60)")
    proc = run_py(["-m", "tfdist.launch", "-n", "2", "--", sys.executable, "-c", code], timeout=40)
    # A worker lost: the status the chief gives when it loses a peer (README, docs/cluster.md).
    assert proc.returncode == exit_codes.PEER_LOST
    assert "worker 0 failed (killed by SIGKILL)" in proc.stderr


@pytest.mark.parametrize("code, lost_host, status", [
    (-9, False, 4), (-11, False, 4), (-15, False, 4),  # died by a signal: lost
    (137, False, 4), (139, False, 4),  # the same through a wrapper (a shell, a memory cap)
    (128, False, 1), (200, False, 1),  # not 128 + a signal
    (255, True, 4),  # ssh's own status for a worker on another host: the host was lost
    (255, False, 1), (7, False, 1), (1, False, 1),  # its own failure
    (2, False, 2), (3, False, 3), (4, False, 4), (75, False, 75), (130, False, 130),
])
def test_a_worker_lost_by_a_signal_or_with_its_host_ends_the_job_with_the_lost_peer_status(
        code, lost_host, status):
    assert job_status(code, lost_host) == status


@pytest.mark.integration
def test_timeout():
    proc = run_py(["-m", "tfdist.launch", "-n", "2", "--timeout", "1", "--", sys.executable, "-c",
                   "import time; time.sleep(60)"], timeout=40)
    assert proc.returncode == 124 and "timed out after 1s" in proc.stderr


@pytest.mark.integration
def test_usage_errors():
    proc = run_py(["-m", "tfdist.launch", "-n", "2"], timeout=30)
    assert proc.returncode == 2 and "no COMMAND given after '--'" in proc.stderr
    proc = run_py(["-m", "tfdist.launch", "-n", "0", "--", "true"], timeout=30)
    assert proc.returncode == 2 and "-n must be >= 1. Received: 0." in proc.stderr


@pytest.mark.integration
def test_max_restarts_relaunches_all_workers(tmp_path):
    marker = tmp_path / "failed-once"
    code = ("import os, json, sys, pathlib; "
            "i = json.loads(os.environ['TF_CONFIG'])['task']['index']; "
            f"m = pathlib.Path({str(marker)!r}); "
            "first = not m.exists(); "
            "(m.touch(), sys.exit(9)) if i == 1 and first else print('run ok', i)")
    proc = run_py(["-m", "tfdist.launch", "-n", "2", "--max-restarts", "1", "--", sys.executable,
                   "-c", code], timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "worker 1 failed (exit code 9)" in proc.stderr
    assert "restarting all 2 worker(s) (restart 1 of 1)" in proc.stderr
    assert "[worker 0] run ok 0" in proc.stdout and "[worker 1] run ok 1" in proc.stdout


@pytest.mark.integration
def test_restarts_run_out_and_config_errors_are_not_retried():
    proc = run_py(["-m", "tfdist.launch", "-n", "2", "--max-restarts", "2", "--", sys.executable,
                   "-c", "import sys; sys.exit(9)"], timeout=60)
    assert proc.returncode == 1 and proc.stderr.count("restarting all") == 2
    proc = run_py(["-m", "tfdist.launch", "-n", "2", "--max-restarts", "2", "--", sys.executable,
                   "-c", "import sys; sys.exit(2)"], timeout=60)
    assert proc.returncode == 2 and "restarting" not in proc.stderr


@pytest.mark.integration
def test_min_workers_goes_on_without_a_worker_that_cannot_come_back():
    # Worker 2 always fails: after 2 restarts the launcher goes on with workers 0 and 1.
    # Each worker says the job size it was started for (TFDIST_JOB_WORKERS), which names
    # tfdist.train's default model dir: survivors go on with the same run.
    code = ("import os, json, sys; t = json.loads(os.environ['TF_CONFIG']); "
            "i, n = t['task']['index'], len(t['cluster']['worker']); "
            "sys.exit(9) if i == 2 else "
            "print('run ok', i, 'of', n, 'job', os.environ['TFDIST_JOB_WORKERS'])")
    proc = run_py(["-m", "tfdist.launch", "-n", "3", "--max-restarts", "2", "--min-workers", "2",
                   "--", sys.executable, "-c", code], timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("restarting all 3 worker(s)") == 2
    assert ("worker 2 did not come back (exit code 9 after 2 restart(s)); relaunching with the "
            "2 surviving worker(s) (--min-workers 2)") in proc.stderr
    assert "[worker 1] run ok 1 of 2 job 3" in proc.stdout and "warning" not in proc.stderr
    # Every worker fails: it shrinks to M and no further, then gives up.
    proc = run_py(["-m", "tfdist.launch", "-n", "3", "--min-workers", "2", "--", sys.executable,
                   "-c", "import sys; sys.exit(9)"], timeout=60)
    assert proc.returncode == 1 and proc.stderr.count("did not come back") == 1
    proc = run_py(["-m", "tfdist.launch", "-n", "2", "--min-workers", "3", "--", "true"],
                  timeout=30)
    assert proc.returncode == 2 and ("--min-workers must be in [1, the number of workers]. "
                                     "Received: --min-workers 3 with -n 2") in proc.stderr


@pytest.mark.integration
def test_log_dir_writes_one_unprefixed_file_per_worker(tmp_path):
    code = ("import os, json, sys; i = json.loads(os.environ['TF_CONFIG'])['task']['index']; "
            "print('out', i); print('err', i, file=sys.stderr)")
    log_dir = tmp_path / "logs"
    proc = run_py(["-m", "tfdist.launch", "-n", "2", "--log-dir", str(log_dir), "--",
                   sys.executable, "-c", code], timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "[worker 1] out 1" in proc.stdout and "[worker 1] err 1" in proc.stderr
    assert sorted(p.name for p in log_dir.iterdir()) == ["worker-0.log", "worker-1.log"]
    for i in range(2):
        assert sorted((log_dir / f"worker-{i}.log").read_text().splitlines()) == [
            f"err {i}", f"out {i}"]


@pytest.mark.integration
def test_help_documents_n_and_the_command_separator():
    proc = run_py(["-m", "tfdist.launch", "--help"], timeout=30)
    text = " ".join(proc.stdout.split())  # argparse wraps to the terminal width
    assert proc.returncode == 0
    assert "synchronous workers to start" in text
    assert "Everything after '--' is COMMAND" in text and "--log-dir" in text


@pytest.mark.integration
@pytest.mark.parametrize("code, word", [(75, "preempted"), (4, "lost peer"), (130, "interrupted")])
def test_tfdist_statuses_are_reported_by_name_and_passed_on(code, word):
    script = ("import os, json, sys, time; i = json.loads(os.environ['TF_CONFIG'])['task']['index']; "
              f"sys.exit({code}) if i == 1 else time.sleep(60)")
    proc = run_py(["-m", "tfdist.launch", "-n", "2", "--", sys.executable, "-c", script],
                  timeout=40)
    assert proc.returncode == code
    assert f"tfdist.launch: worker 1 {word} (exit code {code}); stopping" in proc.stderr


def _process_states(pid: int) -> str:
    """`pid` and its children: state, kernel wait channel and signal masks, from /proc."""
    import os

    def describe(p):
        try:
            with open(f"/proc/{p}/status", encoding="utf-8") as f:
                fields = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
            with open(f"/proc/{p}/wchan", encoding="utf-8") as f:
                wchan = f.read()
        except OSError as e:
            return f"{p}: {e}"
        keys = ("State", "Threads", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
        return f"{p}: wchan {wchan} " + " ".join(f"{k} {fields.get(k)}" for k in keys)

    children = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    children.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return "; ".join(describe(p) for p in [pid, *sorted(children)])


@pytest.mark.integration
def test_sigint_waits_for_workers_to_save_and_reports_each():
    import signal
    import subprocess

    from tests.conftest import REPO, clean_env

    # Each worker takes a while to "save" after SIGINT, then exits 130 as tfdist.train does.
    script = ("import signal, sys, time\n"
              "def stop(*_):\n"
              "    time.sleep(1.5); print('saved', flush=True); sys.exit(130)\n"
              "signal.signal(signal.SIGINT, stop)\n"
              "print('ready', flush=True); time.sleep(60)\n")
    launcher = subprocess.Popen([sys.executable, "-m", "tfdist.launch", "-n", "2", "--",
                                 sys.executable, "-c", script], cwd=REPO, env=clean_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = 0
        while ready < 2:
            ready += launcher.stdout.readline().endswith("ready\n")
        launcher.send_signal(signal.SIGINT)
        try:
            out, err = launcher.communicate(timeout=30)
        except subprocess.TimeoutExpired as e:
            # Seen once in a CI run (worker 1 neither saved nor exited), never reproduced:
            # say what each process was doing, so a next time can be read.
            pytest.fail(f"no exit 30 s after SIGINT; output so far {e.output!r}; "
                        f"processes: {_process_states(launcher.pid)}")
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 130, err
    assert "[worker 0] saved" in out and "[worker 1] saved" in out  # not stopped mid-save
    assert ("tfdist.launch: SIGINT: worker 0 interrupted (exit code 130), worker 1 interrupted "
            "(exit code 130).") in err


def test_tf_configs_across_hosts_name_each_hosts_address():
    endpoints = [("198.18.0.1", 2000), ("198.18.0.1", 2001), ("198.18.0.2", 2000)]
    configs = launch.worker_tf_configs(endpoints)
    assert configs[2] == {"cluster": {"worker": ["198.18.0.1:2000", "198.18.0.1:2001",
                                                 "198.18.0.2:2000"]},
                          "task": {"type": "worker", "index": 2}}
    ps = launch.ps_tf_configs(1, 1, [("198.18.0.1", 1), ("198.18.0.1", 2), ("198.18.0.2", 3)])
    assert ps[2] == ("ps 0", {"cluster": {"chief": ["198.18.0.1:1"], "worker": ["198.18.0.1:2"],
                                          "ps": ["198.18.0.2:3"]},
                              "task": {"type": "ps", "index": 0}})


@pytest.mark.integration
def test_hosts_flags_are_checked_before_any_ssh():
    for args, msg in ((["--hosts", "h0:2", "-n", "2"], "-n N is for workers on this machine"),
                      (["--hosts", "h0:1,h0:1"], "lists 'h0' twice"),
                      (["--hosts", "h0:1", "--ps", "1", "--workers", "1"],
                       "3 tasks do not fit in the 1 slot(s)"),
                      (["-n", "2", "--ssh-config", "/x"], "--ssh-config and -x go with --hosts")):
        proc = run_py(["-m", "tfdist.launch", *args, "--", "true"], timeout=60)
        assert proc.returncode == 2 and msg in proc.stderr, (args, proc.stderr)


@pytest.mark.integration
def test_after_a_failure_a_worker_that_ignores_sigterm_is_killed_without_the_full_grace():
    # Worker 0 ignores SIGTERM, as one stuck in a collective or in TensorFlow's start-up
    # does; worker 1 fails. The survivor cannot save without its peer, so the launcher
    # waits FAILED_GRACE_S (3 s), not GRACE_S (10 s), before killing it.
    import subprocess
    import time

    from tests.conftest import REPO, clean_env

    code = ("import os, json, signal, sys, time; i = json.loads(os.environ['TF_CONFIG'])"
            "['task']['index']; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('up', i, flush=True); time.sleep(1) if i else time.sleep(60); sys.exit(7)")
    p = subprocess.Popen([sys.executable, "-m", "tfdist.launch", "-n", "2", "--", sys.executable,
                          "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, env=clean_env(), cwd=REPO)
    failed_at, err = None, []
    for line in p.stderr:
        err.append(line)
        if "worker 1 failed (exit code 7)" in line:
            failed_at = time.monotonic()
    p.wait(timeout=60)
    stopped_s = time.monotonic() - failed_at
    assert p.returncode == 1 and failed_at is not None, "".join(err)
    assert launch.FAILED_GRACE_S <= stopped_s < launch.GRACE_S - 1, stopped_s


def test_a_worker_that_ended_cleanly_is_not_called_failed_in_the_signal_summary():
    # A pipeline stage holds SIGINT and exits 0 once its chief has saved and ended.
    from tfdist.launch import describe_outcome

    assert describe_outcome(0) == "ended (exit code 0)"
    assert describe_outcome(130) == "interrupted (exit code 130)"
    assert describe_outcome(-9) == "failed (killed by SIGKILL)"
    # A memory cap's or a shell's report of a SIGKILLed child (the OOM killer's signal).
    assert describe_outcome(137) == (
        "failed (exit code 137: killed by SIGKILL, as its wrapper reports it)")


@pytest.mark.integration
def test_the_same_refusal_from_every_worker_is_shown_once_with_its_status():
    # Every task checks the same command line before TensorFlow: one line, exit 2.
    code = ("import sys; print('error: --x 3 cannot be cut; pass --x 4', file=sys.stderr); "
            "sys.exit(2)")
    proc = run_py(["-m", "tfdist.launch", "-n", "3", "--", sys.executable, "-c", code], timeout=40)
    assert proc.returncode == exit_codes.CONFIG
    assert proc.stderr.count("error: --x 3 cannot be cut; pass --x 4") == 1, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
