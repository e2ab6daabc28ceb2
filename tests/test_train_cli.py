"""`python -m tfdist.train` input errors: one clear message, exit 2, before TensorFlow."""

import os

import pytest

from tests.conftest import REPO, clean_env, run_py

# Every test here runs the CLI in its own interpreter.
pytestmark = pytest.mark.integration

PROBE = ("import sys; from tfdist.train import main; rc = main(sys.argv[1:]); "
         "print('TF_IMPORTED=%s' % ('tensorflow' in sys.modules)); sys.exit(rc)")


@pytest.mark.parametrize("argv, message", [
    (["digitz"], "error: recipe 'digitz': not found in the working directory (no "),
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
    # The recipe's own check_config, before TensorFlow (#48: found only after it started).
    (["digits_mlp", "--data-dir", "/no/such/dir"],
     "error: data_dir='/no/such/dir' is not a directory. Pass the one that holds the "),
])
def test_bad_input_fails_before_tensorflow(argv, message):
    proc = run_py(["-c", PROBE, *argv], timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert proc.stderr.count("error:") == 1
    assert "TF_IMPORTED=False" in proc.stdout


def test_a_recipe_without_a_loss_is_refused_before_tensorflow_leaving_nothing(tmp_path):
    own = tmp_path / "no_loss.py"
    own.write_text("import sys; sys.path.insert(0, %r)\n"
                   "from digits_mlp import DEFAULTS, build_model, build_dataset\n"
                   % os.path.join(REPO, "recipes"))
    proc = run_py(["-c", PROBE, str(own)], timeout=60, cwd=str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"error: recipe {own}: defines no compile_kwargs(cfg), so training "
                           "has no loss. Define compile_kwargs(cfg) returning dict(loss=..., "
                           "metrics=[...]) (see recipes/TEMPLATE.py), or train_step(model, "
                           "data).\n")
    assert "TF_IMPORTED=False" in proc.stdout
    assert sorted(os.listdir(tmp_path)) == ["no_loss.py"]  # no runs/, no lock, no backup/


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


# Issue 13's cluster examples through the real CLI: exit 3, the first line names the
# variable and the value, then a HINT line; TensorFlow never imported.
_SRUN = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "2",
         "SLURM_LOCALID": "0", "SLURM_STEP_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": "2",
         "SLURMD_NODENAME": "n1"}
_TASK = '"task": {"type": "worker", "index": 0}'
CLUSTER_EXAMPLES = [
    ({"TF_CONFIG": '{"cluster": {"worker": ["a:1"]}, "task": {"type": ["worker"], "index": 0}}'},
     "task.type", "['worker']"),
    ({"TF_CONFIG": '{"cluster": {"worker": ["a:1"]}, "task": {"type": {"w": 1}, "index": 0}}'},
     "task.type", "{'w': 1}"),
    ({"TF_CONFIG": '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}}'},
     "task.index", "missing"),
    ({"TF_CONFIG": '{"cluster": {"worker": ["a:1"], "evaluator": ["e:1", "f:1"]}, ' + _TASK + '}'},
     "cluster.evaluator", "['e:1', 'f:1']"),
    ({"TF_CONFIG": '{"cluster": {"worker": ["a:1"], "evaluator": ["e:1"]}, '
                   '"task": {"type": "evaluator", "index": 0}}'}, "task.type", "'evaluator'"),
    ({"TF_CONFIG": '{"cluster": {"worker": ["::1:2222"]}, ' + _TASK + '}'},
     "cluster.worker[0]", "::1:2222"),
    ({"TF_CONFIG": '{"cluster": {"worker": ["H:2222", "h:02222"]}, ' + _TASK + '}'},
     "duplicate address", "h:02222"),
    ({"HOROVOD_RANK": "1"}, "HOROVOD_RANK", "'1'"),
    ({"HOROVOD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_SIZE", "'2'"),
    ({"HOROVOD_RANK": "²", "HOROVOD_SIZE": "2"}, "HOROVOD_RANK", "'²'"),
    ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "٣"}, "HOROVOD_SIZE", "'٣'"),
    ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "9" * 5000}, "HOROVOD_SIZE", "'9999"),
    ({**_SRUN, "SLURM_STEP_TASKS_PER_NODE": "1(x1000000000000)"}, "tasks-per-node",
     "1(x1000000000000)"),
    ({**_SRUN, "SLURM_STEP_NODELIST": "n[1-2]x"}, "host list", "n[1-2]x"),
    ({**_SRUN, "SLURM_STEP_NODELIST": "n[0-70000]"}, "host list", "n[0-70000]"),
    ({**_SRUN, "TFDIST_PORT_BASE": "0"}, "TFDIST_PORT_BASE", "0"),
    ({**_SRUN, "SLURM_NTASKS": "10", "SLURM_STEP_TASKS_PER_NODE": "10",
      "TFDIST_PORT_BASE": "65530"}, "TFDIST_PORT_BASE", "65530"),
]
PROBE_ENV = ("import os, sys, time; from tfdist.train import main\n"
             "for env in eval(sys.argv[1]):\n"
             "    os.environ.update(env); t = time.perf_counter()\n"
             "    rc = main(['digits_mlp'])\n"
             "    print('RESULT', rc, 'tensorflow' in sys.modules, time.perf_counter() - t,"
             " flush=True)\n"
             "    print('END', file=sys.stderr, flush=True)\n"
             "    for k in env: del os.environ[k]\n")


def test_issue_cluster_examples_through_the_cli():
    envs = [env for env, _, _ in CLUSTER_EXAMPLES]
    proc = run_py(["-c", PROBE_ENV, repr(envs)], timeout=120)
    results = [line.split() for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    errors = proc.stderr.split("END\n")
    assert len(results) == len(CLUSTER_EXAMPLES), proc.stderr[-3000:]
    for (env, name, value), (_, rc, tf_imported, seconds), err in zip(
            CLUSTER_EXAMPLES, results, errors):
        lines = err.strip().splitlines()
        assert rc == "3" and tf_imported == "False", (env, err[-2000:])
        assert lines[0].startswith("error: ") and lines[-1].startswith("HINT: "), (env, err)
        assert len(lines) == 2 and name in lines[0] and value in lines[0], (env, lines)
        assert "Traceback" not in err
        assert float(seconds) < 5.0, (env, seconds)  # ms on a quiet machine
