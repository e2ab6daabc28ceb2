"""`python -m tfdist.train` input errors: one clear message, exit 2, before TensorFlow."""

import sys

import pytest

from tests.conftest import clean_env, run_py

PROBE = ("import sys; from tfdist.train import main; rc = main(sys.argv[1:]); "
         "print('TF_IMPORTED=%s' % ('tensorflow' in sys.modules)); sys.exit(rc)")


@pytest.mark.parametrize("argv, message", [
    (["digitz"], "error: Recipe 'digitz' not found. Available recipes: ["),
    (["digits_mlp", "--strategy", "magic"],
     "error: Unknown strategy 'magic'. Valid strategies: ['auto', 'single', 'mirrored', "
     "'multi_worker'"),
    (["digits_mlp", "--hidden-unit", "3"],
     "error: Unknown option --hidden-unit for recipe digits_mlp. Known options:"),
    (["digits_mlp", "--epochs", "x"], "error: --epochs expects a int"),
    (["digits_mlp", "--strategy", "mirrored", "--devices", "3", "--global-batch-size", "64"],
     "error: global_batch_size=64 is not divisible by num_replicas=3"),
    (["--lr-scaling", "cube"], "error: Unknown learning-rate scaling rule 'cube'"),
    (["digits_mlp", "--warmup-epochs", "1"],
     "--warmup-epochs 1.0 with --strategy single. Use --warmup-steps N"),
])
def test_bad_input_fails_before_tensorflow(argv, message):
    proc = run_py(["-c", PROBE, *argv], timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert proc.stderr.count("error:") == 1
    assert "TF_IMPORTED=False" in proc.stdout


def test_bad_tf_config_exits_3_with_hint():
    proc = run_py(["-c", PROBE, "digits_mlp"], timeout=60,
                  env=clean_env(TF_CONFIG='{"cluster": {"worker": ["a:1"]}, '
                                          '"task": {"type": "worker", "index": 5}}'))
    assert proc.returncode == 3
    assert "task.index 5 is out of range" in proc.stderr and "HINT:" in proc.stderr
    assert "TF_IMPORTED=False" in proc.stdout


def test_indivisible_batch_on_multi_worker_cluster_fails_early():
    proc = run_py(["-c", PROBE, "digits_mlp", "--global-batch-size", "63"], timeout=60,
                  env=clean_env(TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:1", '
                                          '"127.0.0.1:2"]}, "task": {"type": "worker", '
                                          '"index": 0}}'))
    assert proc.returncode == 2
    assert "global_batch_size=63 is not divisible by num_replicas=2" in proc.stderr


def test_help_lists_options():
    proc = run_py(["-m", "tfdist.train", "digits_mlp", "--help"], timeout=60)
    assert proc.returncode == 0
    assert "--hidden-units" in proc.stdout and "--global-batch-size" in proc.stdout


def test_chief_writes_its_exit_status_file(tmp_path):
    status = tmp_path / "status"
    proc = run_py(["-m", "tfdist.train", "digits_mlp", "--epochs", "1", "--steps-per-epoch", "2",
                   "--verbose", "0", "--model-dir", str(tmp_path / "m"), "--status-file",
                   str(status)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert status.read_text() == "0\n"
    # A backup from another batch size is a CheckpointError (a ConfigError): exit 2, recorded.
    proc = run_py(["-m", "tfdist.train", "digits_mlp", "--epochs", "2", "--steps-per-epoch", "2",
                   "--global-batch-size", "32", "--verbose", "0", "--model-dir",
                   str(tmp_path / "m"), "--status-file", str(status)])
    assert proc.returncode == 2 and status.read_text() == "2\n", proc.stderr[-2000:]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".status")] == []
