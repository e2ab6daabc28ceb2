"""`python -m tfdist.export`: its refusals, each one line before TensorFlow starts.

The export itself (a tensor-parallel stage processes' backup to both forms,
loaded by Keras alone) is tests/integration/test_pipeline_processes.py's.
"""

from __future__ import annotations

import os

import pytest

from tfdist import exit_codes, export


def _refusal(capsys, argv):
    assert export.main(argv) == exit_codes.CONFIG
    err = capsys.readouterr().err
    assert err.startswith("tfdist.export: ") and err.count("\n") == 1, err
    return err


def test_a_missing_run_dir_a_run_without_backups_a_missing_backup_and_a_file_as_out(
        tmp_path, capsys):
    assert "no such directory" in _refusal(capsys, [str(tmp_path / "nope")])
    assert "has no backup to export" in _refusal(capsys, [str(tmp_path)])
    backup = str(tmp_path / "backup" / "ckpt-0000000001.npz")
    assert "--backup" in _refusal(capsys, [str(tmp_path), "--backup", backup])
    os.makedirs(os.path.dirname(backup))
    open(backup, "wb").close()
    (tmp_path / "file").write_text("")
    assert "is a file" in _refusal(capsys, [str(tmp_path), "--out", str(tmp_path / "file")])


def test_a_bad_form_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as e:
        export.parse_args(["runs/x", "--form", "h5"])
    assert e.value.code == 2
    assert "invalid choice: 'h5'" in capsys.readouterr().err
