"""Run directories: recorded configuration, finished runs, default dir per launch shape."""

import json

import numpy as np
import pytest

from tfdist import config
from tfdist.cluster import detect, local
from tfdist.cluster.base import ClusterInfo
from tfdist.run import run_dir
from tfdist.run import types as run_types
from tfdist.checkpoint import BackupStore, TrainState
from tfdist.writer import ChiefWriter
from tfdist.errors import ConfigError


class _Var:
    def __init__(self, value):
        self.value, self.name, self.path = np.asarray(value), "v", "v"
        self.shape, self.dtype = self.value.shape, self.value.dtype

    def numpy(self):
        return self.value


def _cfg(**over):
    return {**config.FRAMEWORK_DEFAULTS, **over}


def _backup(model_dir, cfg, epoch, step_in_epoch=0):
    state = TrainState(epoch=epoch, step_in_epoch=step_in_epoch,
                       global_step=epoch * 10 + step_in_epoch)
    meta = {"recipe": "r", "num_replicas": 1, "global_batch_size": 64,
            "config": run_dir.run_config(cfg), "epochs": cfg["epochs"]}
    return BackupStore(ChiefWriter(str(model_dir), True)).save(state, [_Var([1.0])], [], meta)


def _metrics(model_dir, global_step):
    (model_dir / "metrics.json").write_text(json.dumps({"global_step": global_step}))


def _cluster(source="local", workers=1, ps=0, launcher=None):
    """A ClusterInfo as tfdist.launch, Slurm or a hand-written TF_CONFIG gives it."""
    if source == "local":
        return ClusterInfo(source="local", num_workers=1, worker_index=0)
    spec = {"worker": [f"h:{i}" for i in range(workers)]}
    if ps:
        spec = {"chief": ["h:90"], **spec, "ps": [f"h:{100 + i}" for i in range(ps)]}
    tf_config = {"cluster": spec, "task": {"type": "worker", "index": 0}}
    return ClusterInfo(source=source, num_workers=workers + (1 if ps else 0), worker_index=0,
                       tf_config=tf_config, launcher=launcher)


LAUNCH = "tfdist.launch"


@pytest.mark.parametrize("strategy, devices, cluster, gpus, expected", [
    # The main job (`auto`) names what it runs: single where no GPU can exist ...
    ("auto", 0, _cluster(), False, "single"),
    ("single", 0, _cluster(), False, "single"),
    # ... and stays `auto` where TensorFlow may count GPUs (single or mirrored).
    ("auto", 0, _cluster(), True, "auto"),
    ("auto", 2, _cluster(), True, "mirrored-2dev"),
    ("mirrored", 2, _cluster(), False, "mirrored-2dev"),
    # tfdist.launch -n 2, a hand-written TF_CONFIG and Slurm: three different jobs.
    ("multi_worker", 0, _cluster("tf_config", 2, launcher=LAUNCH), True, "multi_worker-2w"),
    ("auto", 0, _cluster("tf_config", 2, launcher=LAUNCH), True, "multi_worker-2w"),
    ("auto", 0, _cluster("tf_config", 2), True, "multi_worker-2w-tf_config"),
    ("auto", 0, _cluster("slurm", 2, launcher="srun"), True, "multi_worker-2w-slurm"),
    ("shm", 0, _cluster("tf_config", 2, launcher=LAUNCH), True, "shm-2w"),
    ("shm", 0, _cluster("slurm", 2, launcher="srun"), True, "shm-2w-slurm"),
    ("pipeline", 0, _cluster("tf_config", 2, launcher=LAUNCH), True, "pipeline-2st"),
    # Parameter server: its workers (the chief aside) and its ps tasks.
    ("parameter_server", 0, _cluster("tf_config", 2, ps=1, launcher=LAUNCH), True,
     "parameter_server-2w-1ps"),
    ("auto", 0, _cluster("slurm", 1, ps=1, launcher="srun"), True,
     "parameter_server-1w-1ps-slurm"),
    ("horovod", 0, ClusterInfo(source="horovod", num_workers=4, worker_index=0,
                               launcher="horovodrun"), True, "horovod-4w"),
])
def test_default_model_dir_names_what_runs(strategy, devices, cluster, gpus, expected):
    cfg = _cfg(strategy=strategy, devices=devices)
    assert run_dir.default_model_dir("d", cfg, cluster, gpus) == f"runs/d/{expected}"
    # A rerun of the same command on the same machine finds the same dir (resume).
    assert run_dir.default_model_dir("d", dict(cfg), cluster, gpus) == f"runs/d/{expected}"


@pytest.mark.parametrize("strategy, over, workers, expected", [
    # tfdist.launch -n 4: 2 stages x 2 copies, and 4 stages: two layouts, two dirs.
    ("pipeline", dict(stages=2), 4, "pipeline-2st-2cp"),
    ("pipeline", dict(), 4, "pipeline-4st"),
    ("pipeline", dict(stages=4), 4, "pipeline-4st"),
    # --devices 0 or P across processes: the stages say it.
    ("pipeline", dict(devices=2), 2, "pipeline-2st"),
    # Micro-batches where they change the math: float16 rounds each one apart.
    ("pipeline", dict(microbatches=4), 2, "pipeline-2st"),
    ("pipeline", dict(microbatches=4, precision="mixed_float16"), 2, "pipeline-2st-4mb"),
    # One process: --devices, and tensor parallelism (weights stored as shards).
    ("model_parallel", dict(devices=2), 1, "model_parallel-2dev"),
    ("model_parallel", dict(devices=2, tensor_parallel=2), 1, "model_parallel-2dev-2tp"),
    ("pipeline", dict(devices=4, tensor_parallel=2, microbatches=4), 1,
     "pipeline-4dev-2tp"),
])
def test_default_model_dir_names_the_layout(strategy, over, workers, expected):
    cluster = _cluster("tf_config", workers, launcher=LAUNCH) if workers > 1 else _cluster()
    cfg = _cfg(strategy=strategy, **over)
    assert run_dir.default_model_dir("d", cfg, cluster, False) == f"runs/d/{expected}"


def test_every_layout_of_the_issue_has_its_own_dir():
    """#38: layouts that a user tries one after another never meet in one dir."""
    four = _cluster("tf_config", 4, launcher=LAUNCH)
    dirs = [run_dir.default_model_dir("d", _cfg(strategy="pipeline", stages=2), four),
            run_dir.default_model_dir("d", _cfg(strategy="pipeline"), four),
            run_dir.default_model_dir("d", _cfg(strategy="model_parallel", devices=2), _cluster()),
            run_dir.default_model_dir("d", _cfg(strategy="model_parallel", devices=2,
                                                tensor_parallel=2), _cluster())]
    assert len(set(dirs)) == len(dirs), dirs


def _tasks(spec, launcher="tfdist.launch"):
    """Every task's environment of a TF_CONFIG cluster `spec`, as tfdist.launch sets it."""
    import json as json_lib

    for kind, addresses in spec.items():
        for i in range(len(addresses)):
            conf = json_lib.dumps({"cluster": spec, "task": {"type": kind, "index": i}})
            yield {"TF_CONFIG": conf, **({"TFDIST_LAUNCHER": launcher} if launcher else {})}


def _slurm_tasks(ntasks, **extra):
    for r in range(ntasks):
        yield dict(SLURM_JOB_ID="7", SLURM_PROCID=str(r), SLURM_NTASKS=str(ntasks),
                   SLURM_LOCALID=str(r), SLURM_STEP_ID="0", SLURM_STEP_NODELIST="n1",
                   SLURM_STEP_TASKS_PER_NODE=str(ntasks), **extra)


@pytest.mark.parametrize("environs, strategy, expected", [
    (list(_tasks({"worker": ["h:1", "h:2"]})), "multi_worker", "multi_worker-2w"),
    (list(_tasks({"worker": ["h1:2222", "h2:2222"]}, launcher=None)), "auto",
     "multi_worker-2w-tf_config"),
    (list(_slurm_tasks(2)), "auto", "multi_worker-2w-slurm"),
    # Survivors that tfdist.launch -n 3 --min-workers 2 relaunched: the same run.
    ([{**env, "TFDIST_JOB_WORKERS": "3"} for env in _tasks({"worker": ["h:1", "h:2"]})],
     "multi_worker", "multi_worker-3w"),
    (list(_tasks({"chief": ["h:10"], "worker": ["h:1", "h:2"], "ps": ["h:3"]})),
     "parameter_server", "parameter_server-2w-1ps"),
    (list(_slurm_tasks(3, TFDIST_NUM_PS="1")), "parameter_server",
     "parameter_server-1w-1ps-slurm"),
])
def test_every_task_of_a_discovered_job_names_the_same_dir(environs, strategy, expected):
    # The README's launch modes, discovered as each task would: chief, workers and ps
    # tasks agree on the one dir the chief writes and the others read.
    dirs = {run_dir.default_model_dir("d", _cfg(strategy=strategy), detect(env), True)
            for env in environs}
    assert dirs == {f"runs/d/{expected}"}


def test_model_dir_for_is_the_option_when_given_else_the_default(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")  # no GPU: auto is single here
    assert run_types.model_dir_for(_cfg(model_dir="mine"), "d") == "mine"
    assert run_types.model_dir_for(_cfg(), "d") == "runs/d/single"


@pytest.mark.parametrize("environ, dev, platform, possible", [
    ({}, ["null", "nvidia0", "nvidiactl"], "linux", True),
    ({}, ["kfd"], "linux", True),
    ({}, ["null", "tty", "shm"], "linux", False),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, ["nvidia0"], "linux", False),
    ({"CUDA_VISIBLE_DEVICES": ""}, ["nvidia0"], "linux", False),
    ({"CUDA_VISIBLE_DEVICES": "0"}, ["nvidia0"], "linux", True),
    ({}, [], "darwin", True),  # Metal plugins: told only by TensorFlow
])
def test_gpus_possible(environ, dev, platform, possible):
    assert local.gpus_possible(environ, dev, platform) is possible


def test_run_config_leaves_out_run_control_and_differences_name_each_option():
    a = run_dir.run_config(_cfg(epochs=3, verbose="0"))
    assert "epochs" not in a and "verbose" not in a and "learning_rate" in a
    b = run_dir.run_config(_cfg(learning_rate=0.2, seed=1, strategy="multi_worker"))
    assert run_dir.differences(a, b) == ["--learning-rate 0.05 there, 0.2 here",
                                        "--seed 0 there, 1 here"]  # auto matches any strategy


def test_synchronous_strategies_and_their_layout_are_not_the_identity():
    mwms = run_dir.run_config(_cfg(strategy="multi_worker"))
    for here in (_cfg(strategy="single"), _cfg(strategy="mirrored", devices=3),
                 _cfg(strategy="horovod"), _cfg(strategy="shm")):
        assert run_dir.differences(mwms, run_dir.run_config(here)) == []
    # A pipeline (any stages, micro-batches, schedule) is the same math as one device.
    pipeline = run_dir.run_config(_cfg(strategy="pipeline", microbatches=4, stages=2,
                                       schedule="1f1b", devices=0))
    assert run_dir.differences(mwms, pipeline) == []
    mp = run_dir.run_config(_cfg(strategy="model_parallel", devices=2))
    assert run_dir.differences(mp, run_dir.run_config(_cfg(strategy="model_parallel"))) == []
    # Tensor parallelism is layout too: a backup records each shard's slice (reshard).
    assert run_dir.differences(mp, run_dir.run_config(
        _cfg(strategy="model_parallel", tensor_parallel=2))) == []
    assert run_dir.differences(mwms, run_dir.run_config(_cfg(strategy="parameter_server"))) == [
        "--strategy 'multi_worker' there, 'parameter_server' here"]
    assert run_dir.differences(mwms, run_dir.run_config(
        _cfg(strategy="single", global_batch_size=96))) == [
        "--global-batch-size 64 there, 96 here"]


def test_inspect_fresh_resumable_finished_and_different(tmp_path):
    cfg = _cfg(epochs=2)
    assert run_dir.inspect(str(tmp_path), cfg) == run_dir.Found()
    _backup(tmp_path, cfg, epoch=1)
    found = run_dir.inspect(str(tmp_path), cfg)
    assert found.backup and found.epochs_done == 1 and not found.finished
    _backup(tmp_path, cfg, epoch=2)
    # Its epochs done, but no final model yet (metrics.json is written after it): the
    # rerun resumes to write it, not "already finished".
    unsaved = run_dir.inspect(str(tmp_path), cfg)
    assert unsaved.unsaved_end and not unsaved.finished
    _metrics(tmp_path, global_step=10)  # an earlier end's (epoch 1): not this one
    assert not run_dir.inspect(str(tmp_path), cfg).finished
    _metrics(tmp_path, global_step=20)
    assert run_dir.inspect(str(tmp_path), cfg).finished
    assert not run_dir.inspect(str(tmp_path), cfg).unsaved_end
    assert run_dir.inspect(str(tmp_path), _cfg(epochs=1)).finished  # fewer asked: still done
    extended = run_dir.inspect(str(tmp_path), _cfg(epochs=4))
    assert not extended.finished and extended.epochs_asked == 2
    with pytest.raises(ConfigError, match=r"holds a run with another configuration .*"
                                          r"--global-batch-size 64 there, 32 here.*--no-resume"
                                          r".*--model-dir DIR"):
        run_dir.inspect(str(tmp_path), _cfg(epochs=2, global_batch_size=32))
    assert run_dir.inspect(str(tmp_path), _cfg(epochs=2, resume=False)) == run_dir.Found()


def test_the_rerun_rule_is_one_declaration_and_decides_what_is_recorded_and_compared():
    # Output forms, logging, memory and speed, run control: a rerun may change them.
    free = ["final_weights", "csv_log", "tensorboard", "status_file", "verbose", "tf_logs",
            "shard", "shard_optimizer_state", "threads", "inter_op_threads", "bucket_mb",
            "collective", "collective_timeout_s", "startup_timeout_s", "epochs", "keep",
            "save_every_steps", "resume", "model_dir"]
    assert [k for k in free if not config.rerun_may_change(k)] == []
    from tfdist import straggler  # noqa: F401  (registers the benchmarks' instrument)

    assert config.rerun_may_change("straggler_delay_ms")  # an instrument's: never the run
    # What the run computes: model, data, batch, optimizer, precision, seed, layout.
    defining = ["learning_rate", "global_batch_size", "optimizer", "momentum", "precision",
                "seed", "accumulate", "clipnorm", "grad_compression", "strategy", "devices",
                "microbatches", "stages", "tensor_parallel", "hidden_units"]
    assert [k for k in defining if config.rerun_may_change(k)] == []
    assert set(config.RERUN_FREE.values()) == {"control", "output", "logging", "memory"}
    assert all(k in config.OPTIONS for k in config.RERUN_FREE)
    recorded = run_dir.run_config(_cfg(final_weights="sharded", shard_optimizer_state=True))
    assert "final_weights" not in recorded and "shard_optimizer_state" not in recorded
    assert "learning_rate" in recorded and "strategy" in recorded
    # A backup written before the rule recorded them: they are not compared either.
    old = {**recorded, "final_weights": "auto", "shard_optimizer_state": False}
    assert run_dir.differences(old, recorded) == []
    assert run_dir.differences(recorded, run_dir.run_config(_cfg(precision="mixed_float16"))) \
        == ["--precision 'float32' there, 'mixed_float16' here"]
    # A finished run names the memory and speed options it had nothing to use them on.
    assert run_dir.idle_options({"shard_optimizer_state", "threads", "final_weights",
                                 "epochs"}) == ["--shard-optimizer-state", "--threads"]
    # --help and docs/options.md say the rule.
    assert "--shard-optimizer-state" in config.RERUN_RULE and "--shard," in config.RERUN_RULE
    assert "--final-weights" in config.RERUN_RULE


def test_a_finished_run_lacks_the_form_asked_for(tmp_path):
    assert run_dir.missing_form(str(tmp_path), "keras") == "keras"
    assert run_dir.missing_form(str(tmp_path), "sharded") == "sharded"
    assert run_dir.missing_form(str(tmp_path), "auto") is None  # whichever it wrote
    (tmp_path / "model.keras").write_text("")
    assert run_dir.missing_form(str(tmp_path), "keras") is None
    (tmp_path / "model.json").write_text("")
    assert run_dir.missing_form(str(tmp_path), "sharded") == "sharded"  # no index
    (tmp_path / "model.weights.json").write_text("")
    assert run_dir.missing_form(str(tmp_path), "sharded") is None


def test_mid_epoch_backup_is_not_finished(tmp_path):
    cfg = _cfg(epochs=2)
    _backup(tmp_path, cfg, epoch=2, step_in_epoch=3)
    assert not run_dir.inspect(str(tmp_path), cfg).finished
    assert json.dumps(run_dir.run_config(cfg))  # recordable as JSON


def test_batch_change_needs_the_flag_and_rescales_from_the_backups_rate(tmp_path):
    cfg = _cfg(epochs=2, learning_rate=0.1)
    _backup(tmp_path, cfg, epoch=1, step_in_epoch=6)
    with pytest.raises(ConfigError, match=r"--global-batch-size 64 there, 96 here.*pass "
                                          r"--rescale-lr-on-batch-change"):
        run_dir.inspect(str(tmp_path), _cfg(epochs=2, learning_rate=0.1, global_batch_size=96))
    asked = _cfg(epochs=2, learning_rate=0.1, global_batch_size=96, lr_scaling="linear",
                 rescale_lr_on_batch_change=True)
    found = run_dir.inspect(str(tmp_path), asked)
    assert (found.global_batch_size, found.learning_rate, found.step_in_epoch) == (64, 0.1, 6)
    lr, line = run_dir.resume_learning_rate(found, asked, computed=0.1)
    assert lr == pytest.approx(0.15)
    assert "global batch 64 at global batch 96; learning rate 0.1 -> 0.15 (--lr-scaling " \
           "linear" in line and "math now differs" in line
    assert run_dir.resume_learning_rate(found, {**asked, "lr_scaling": "sqrt"}, 0.1)[0] == (
        pytest.approx(0.1 * 1.5 ** 0.5))
    assert run_dir.resume_learning_rate(found, {**asked, "lr_scaling": "none"}, 0.1)[0] == 0.1
    # Other differences stay refused with the flag.
    with pytest.raises(ConfigError, match="--learning-rate 0.1 there, 0.2 here"):
        run_dir.inspect(str(tmp_path), {**asked, "learning_rate": 0.2})


def test_a_rescaled_rate_is_kept_on_every_rerun_at_the_new_batch():
    found = run_dir.Found(backup="b", global_batch_size=96, learning_rate=0.15)
    assert run_dir.resume_learning_rate(found, _cfg(global_batch_size=96), 0.1) == (0.15, None)
    assert run_dir.resume_learning_rate(run_dir.Found(), _cfg(), 0.1) == (0.1, None)
    # Backups from before the rate was recorded: computed from their options.
    conf = run_dir.run_config(_cfg(learning_rate=0.1, lr_scaling="linear", base_batch_size=32))
    assert run_dir.recorded_learning_rate({"config": conf}) == pytest.approx(0.2)


def _training(**over):
    from tfdist.settings import Settings

    return Settings.of(_cfg(**over)).training


def test_batch_change_mid_epoch_under_fixed_epoch_length_is_refused_before_tensorflow():
    from tfdist.run.trainer import check_batch_change

    found = run_dir.Found(backup="b/ckpt-6.npz", global_batch_size=64, step_in_epoch=6)
    with pytest.raises(ConfigError, match=r"b/ckpt-6.npz was taken at step 6 of an epoch at "
                                          r"global batch 64; with --steps-per-epoch 10 .* "
                                          r"at global batch 96"):
        check_batch_change(found, _training(global_batch_size=96, steps_per_epoch=10))
    check_batch_change(found, _training(global_batch_size=96))  # epochs are passes: mapped
    check_batch_change(found, _training(global_batch_size=64, steps_per_epoch=10))  # no change
    at_epoch_end = run_dir.Found(backup="b", global_batch_size=64)
    check_batch_change(at_epoch_end, _training(global_batch_size=96, steps_per_epoch=10))


def test_epochs_change_line_says_what_the_rerun_does():
    def line(asked, done, epochs, step_in_epoch=0):
        found = run_dir.Found(backup="b", epochs_done=done, epochs_asked=asked,
                              step_in_epoch=step_in_epoch)
        return run_dir.epochs_change_line(found, epochs, "runs/x")

    assert line(None, 3, 5) is None and line(5, 3, 5) is None  # unknown, or the same asked
    assert line(2, 2, 4) == "extending the run in runs/x from 2 to 4 epochs (2 done)"
    # Fewer epochs asked than before: never "extending ... from 200 to 30".
    assert line(200, 20, 30, step_in_epoch=5) == (
        "shortening the run in runs/x from 200 to 30 epochs (20 done): it stops after epoch 30")
    assert line(200, 35, 30, step_in_epoch=4) == (
        "the run in runs/x is already past 30 epochs (35 done and 4 steps of epoch 36, of the "
        "200 asked before): no step is trained; its model as backed up is evaluated and "
        "written. Pass --epochs N (N > 35) to train it further")
    assert line(3, 1, 1, step_in_epoch=12).startswith("the run in runs/x is already past 1 epoch "
                                                      "(1 done and 12 steps of epoch 2, of the 3")
    assert line(200, 30, 30, step_in_epoch=4).startswith(
        "the run in runs/x is already past 30 epochs (30 done and 4 steps of epoch 31")
