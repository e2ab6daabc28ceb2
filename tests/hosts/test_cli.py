"""`python -m tfdist.hosts` refuses bad input before touching the system (no root needed)."""

from __future__ import annotations

import pytest

from tfdist.hosts.__main__ import main


def test_bad_rate_is_refused_with_what_was_received(capsys):
    assert main(["--cluster", "tbadrate", "up", "2", "--rate", "fast"]) == 2
    assert "Received: 'fast'" in capsys.readouterr().err


def test_bad_cluster_name_is_refused(capsys):
    assert main(["--cluster", "Bad_Name", "status"]) == 2
    assert "Received: 'Bad_Name'" in capsys.readouterr().err


def test_exec_needs_a_command_and_only_exec_takes_one(capsys):
    assert main(["--cluster", "tnocmd", "exec", "h0"]) == 2
    assert "no command after '--'" in capsys.readouterr().err
    assert main(["--cluster", "tnocmd", "status", "--", "ls"]) == 2
    assert "only `exec`" in capsys.readouterr().err


def test_a_cluster_that_is_not_up_says_how_to_start_it(capsys, tmp_path):
    assert main(["--cluster", "tnotup", "ssh-config"]) == 3
    assert "is not up" in capsys.readouterr().err


@pytest.mark.integration
def test_imports_no_tensorflow():
    from tests.conftest import run_py

    proc = run_py(["-c", "import sys, tfdist.hosts.__main__; "
                   "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules"],
                  timeout=60)
    assert proc.returncode == 0, proc.stderr
