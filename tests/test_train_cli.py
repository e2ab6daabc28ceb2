"""`python -m tfdist.train` input errors: one clear message, exit 2, before TensorFlow."""

import sys

import pytest

from tests.conftest import clean_env, run_py

PROBE = ("import sys; from tfdist.train import main; rc = main(sys.argv[1:]); "
         "print('TF_IMPORTED=%s' % ('tensorflow' in sys.modules)); sys.exit(rc)")


@pytest.mark.parametrize("argv, message", [
    (["digitz"], "error: recipe 'digitz': not found. Available recipes: ["),
    (["digits_mlp", "--strategy", "magic"],
     "error: --strategy must be one of auto, single, mirrored, multi_worker"),
    (["digits_mlp", "--hidden-unit", "3"],
     "error: Unknown option --hidden-unit for recipe digits_mlp. Did you mean --hidden-units? "
     "Known options:"),
    (["digits_mlp", "--epochs", "x"], "error: --epochs expects an integer"),
    (["digits_mlp", "--strategy", "mirrored", "--devices", "3", "--global-batch-size", "64"],
     "error: global_batch_size=64 is not divisible by num_replicas=3"),
    (["--lr-scaling", "cube"], "error: --lr-scaling must be one of none, linear, sqrt. "
                               "Received: --lr-scaling 'cube'."),
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


def test_help_lists_options_with_meaning_default_and_recipe():
    proc = run_py(["-m", "tfdist.train", "digits_mlp", "--help"], timeout=60)
    assert proc.returncode == 0
    out = proc.stdout
    assert "--global-batch-size" in out and "examples per optimizer step" in out
    recipe_part = out[out.index("recipe digits_mlp options:"):]
    assert "--hidden-units N" in recipe_part and "units of the hidden layer" in recipe_part
    assert "(default 0.2; > 0; < 1)" in recipe_part  # --test-fraction
    # The recipe's default for a framework option is the one shown.
    assert "(default 10; >= 1)" in out[out.index("--epochs"):]
    assert "--optimizer {sgd|adam|" in out


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


# Issue 13's examples through the real CLI: exit 2, one line naming option and value,
# TensorFlow never imported. (The in-process cases are in tests/test_config.py.)
ISSUE_EXAMPLES = [
    ["--steps-per-epoch", "-5"], ["--test-fraction", "2"], ["--epochs", "-1"], ["--epochs", "0"],
    ["--learning-rate", "nan"], ["--learning-rate", "inf"], ["--learning-rate", "-1"],
    ["--momentum", "nan"], ["--devices", "-2"], ["--shuffle-buffer", "-1"],
    ["--collective-timeout-s", "-1"], ["--collective", "magic"], ["--verbose", "7"],
    ["--keep", "0"], ["--epochs", "2", "--epochs", "3"], ["--threads", "-1"], ["--seed", "-1"],
    ["--hidden-units", "0"], ["--optimizer", "magic"],
    ["--strategy", "single", "--collective", "ring"],
]
PROBE_ALL = ("import sys, time; from tfdist.train import main\n"
             "for argv in eval(sys.argv[1]):\n"
             "    t = time.perf_counter(); rc = main(['digits_mlp', *argv])\n"
             "    print('RESULT', rc, 'tensorflow' in sys.modules, time.perf_counter() - t,"
             " flush=True)\n"
             "    print('END', file=sys.stderr, flush=True)\n")


def test_issue_examples_through_the_cli():
    proc = run_py(["-c", PROBE_ALL, repr(ISSUE_EXAMPLES)], timeout=120)
    results = [line.split() for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    errors = proc.stderr.split("END\n")
    assert len(results) == len(ISSUE_EXAMPLES), proc.stderr[-3000:]
    for argv, (_, rc, tf_imported, seconds), err in zip(ISSUE_EXAMPLES, results, errors):
        flag, value = argv[-2], argv[-1]
        lines = err.strip().splitlines()
        assert rc == "2" and tf_imported == "False", (argv, err)
        assert len(lines) == 1 and lines[0].startswith("error: "), (argv, err)
        assert flag in lines[0] and value in lines[0], (argv, lines[0])
        # About 0.1 s (0.5 s when the strategy check imports the trainer) on a quiet machine.
        assert float(seconds) < 5.0, (argv, seconds)


def test_repeated_flag_in_subprocess_exits_2():
    proc = run_py(["-m", "tfdist.train", "digits_mlp", "--strategy", "single", "--strategy",
                   "mirrored"], timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: --strategy is given twice (--strategy single, then "
                                   "--strategy mirrored); give it once.")
