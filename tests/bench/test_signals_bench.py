"""`python -m tfdist.bench signals`: the pure parts (the command, a trial's verdict)."""

from __future__ import annotations

from tfdist.bench import signals


def test_a_trial_passes_only_with_the_signals_status_a_backup_and_a_finished_rerun():
    ok = dict(status=None, backups=["ckpt-1.npz"], output="", rerun_code=0)
    assert signals.classify("SIGTERM", 75, **{**ok, "status": "75"}) == []
    assert signals.classify("SIGINT", 130, **{**ok, "status": "130"}) == []
    assert signals.classify("SIGTERM", 143, **ok) == ["exit 143, not 75", "status file None"]
    assert signals.classify("SIGINT", 130, **{**ok, "status": "130", "backups": [],
                                              "rerun_code": 1}) == ["no backup", "rerun exit 1"]
    aborted = signals.classify("SIGINT", 4, **{**ok, "status": "4", "output":
                               "terminate called after throwing an instance of"})
    assert aborted == ["exit 4, not 130", "status file '4'", "printed 'terminate called'"]


def test_a_signal_after_the_status_file_was_written_expects_the_finished_runs_exit_0():
    ok = dict(backups=["ckpt-660.npz"], output="", rerun_code=0)
    assert signals.classify("SIGTERM", 0, status="0", late=True, **ok) == []
    assert signals.classify("SIGTERM", 0, status="0", **ok) == ["exit 0, not 75",
                                                                "status file '0'"]
    assert signals.classify("SIGTERM", 75, status="0", late=True, **ok) == ["exit 75, not 0"]


def test_the_trial_commands():
    single = signals.command("single", "digits_mlp", 3, "/d")
    assert single[1:] == ["-m", "tfdist.train", "digits_mlp", "--epochs", "3", "--model-dir",
                          "/d", "--status-file", "/d/status", "--verbose", "0"]
    launch = signals.command("launch", "digits_mlp", 3, "/d")
    assert launch[1:6] == ["-m", "tfdist.launch", "-n", "2", "--"]
    assert launch[-2:] == ["--strategy", "multi_worker"]
