"""Adapters as classes: registered by class, owning their options and pre-TensorFlow
checks; the run pipeline names no strategy (pure, no TensorFlow)."""

import io
import json
import os
import socket
import tokenize

import pytest

from tests.conftest import REPO
from tfdist import config, strategies
from tfdist.run import trainer
from tfdist.cluster import detect
from tfdist.errors import ClusterError, ConfigError

LOCAL = detect({})


def _check(cfg, cluster, choice=None):
    """The run pipeline's pre-TensorFlow checks of a merged configuration."""
    from tfdist.run import trainer as run_trainer
    from tfdist.settings import Settings

    run_trainer.check_before_tensorflow(Settings.of(cfg), cluster, choice)


def _tf_config(workers, index=0, **jobs):
    spec = {"worker": workers, **jobs}
    return detect({"TF_CONFIG": json.dumps({"cluster": spec,
                                            "task": {"type": "worker", "index": index}})})


# The run pipeline: the modules that set up, train and finish a run. The CLI
# (tfdist/train.py) lists launch commands in its docstring and is not one of them.
PIPELINE = ["tfdist/run/trainer.py", "tfdist/run/loop.py", "tfdist/settings.py", "tfdist/run/types.py",
            "tfdist/run/run_dir.py", "tfdist/run/coordinator.py",
            "tfdist/callbacks.py", "tfdist/checkpoint.py",
            "tfdist/writer.py", "tfdist/model_dir.py"]


def strategy_names_in(path: str) -> list[tuple[int, str]]:
    """(line, token) for every name or string (docstrings too, not comments) that
    holds a strategy name as a word."""
    import re

    names = [n for n in strategies.REGISTRY]
    word = re.compile(r"(?<![\w-])(" + "|".join(names) + r")(?![\w-])")
    with open(path, encoding="utf-8") as f:
        source = f.read()
    found = []
    kinds = (tokenize.NAME, tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", -1))
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        # "the run pipeline" is this layer's name, not the `pipeline` strategy.
        text = re.sub(r"run\s+pipeline", "", tok.string)
        if tok.type in kinds and word.search(text):
            found.append((tok.start[0], tok.string[:80]))
    return found


@pytest.mark.parametrize("path", PIPELINE)
def test_the_run_pipeline_names_no_strategy(path):
    assert strategy_names_in(os.path.join(REPO, path)) == []


def test_the_name_check_finds_names(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('x = cfg["strategy"] == "multi_worker"  # shm in a comment is fine\n'
                     'from tfdist.strategies import horovod\n'
                     'y = "a single device"\n'
                     '"""The run pipeline, and the pipeline strategy."""\n'
                     '"""The run\n pipeline."""\n')
    assert [line for line, _ in strategy_names_in(str(probe))] == [1, 2, 3, 4]


def test_every_adapter_is_a_registered_class_in_its_own_file():
    assert list(strategies.REGISTRY) == ["single", "mirrored", "multi_worker", "model_parallel",
                                         "pipeline", "horovod", "shm", "parameter_server"]
    for name, adapter in strategies.REGISTRY.items():
        assert issubclass(adapter, strategies.Adapter) and adapter.name == name
        assert adapter.__module__ == f"tfdist.strategies.{name}"
        assert adapter.loop in trainer.LOOPS
    with pytest.raises(ValueError, match="'shm' is empty or taken"):
        strategies.register(type("Again", (strategies.Adapter,), {"name": "shm"}))


def test_which_strategies_an_option_applies_to_is_the_adapters_declaration():
    declared = set()
    for adapter in strategies.REGISTRY.values():
        declared |= set(adapter.accepts) | set(adapter.refuses)
    assert declared <= set(config.OPTIONS)  # nothing declared for an option that is not there
    for key, option in config.OPTIONS.items():
        assert option.strategies == strategies.accepting(key), key
    assert config.OPTIONS["collective_timeout_s"].strategies == ("multi_worker", "pipeline", "shm")
    assert config.OPTIONS["epochs"].strategies is None


def test_auto_is_one_choice_checked_for_every_candidate_before_tensorflow():
    choice = strategies.choose("auto", LOCAL, None)
    assert choice.names == {"single", "mirrored"} and choice.loop == "fit"
    assert choice.resolve(gpus=0).name == "single" and choice.resolve(gpus=2).name == "mirrored"
    assert strategies.choose("auto", _tf_config(["a:1", "b:1"]), None).names == {"multi_worker"}
    ps = _tf_config(["a:1"], chief=["c:1"], ps=["p:1"])
    ps_choice = strategies.choose("auto", ps, None)
    assert ps_choice.names == {"parameter_server"} and ps_choice.loop == "coordinator"
    assert not ps_choice.candidates[0].runs_loop(ps)  # a worker serves


def test_the_adapter_says_which_tasks_run_the_loop_and_what_the_others_do():
    """The coordinator loop asks the adapter (`runs_loop`, `serve`), not the task type."""
    import dataclasses

    spec = {"chief": ["c:1"], "worker": ["a:1"], "ps": ["p:1"]}

    def task(kind):
        return detect({"TF_CONFIG": json.dumps({"cluster": spec,
                                                "task": {"type": kind, "index": 0}})})

    ps = strategies.REGISTRY["parameter_server"]
    assert [ps.runs_loop(task(k)) for k in ("chief", "worker", "ps")] == [True, False, False]
    other = dataclasses.replace(task("worker"), task_type="other")  # detect() refuses one
    with pytest.raises(ClusterError, match="task type 'other' has no role in "
                                           "parameter-server training; valid: chief, worker, ps"):
        ps(other).serve()
    with pytest.raises(NotImplementedError, match="--strategy single runs its loop on every"):
        strategies.REGISTRY["single"](LOCAL).serve()


def _cfg(*argv):
    return config.merge({}, list(argv), "recipe r")


@pytest.mark.parametrize("argv, cluster, error, message", [
    (["--strategy", "mirrored", "--devices", "3"], LOCAL, ConfigError, "not divisible"),
    (["--strategy", "shm"], _tf_config(["127.0.0.1:1", "198.18.0.9:1"]), ClusterError,
     "are on other hosts"),
    (["--strategy", "pipeline", "--devices", "2", "--microbatches", "5"], LOCAL, ConfigError,
     "microbatches"),
    # One process, no --devices: one stage, no pipeline; refused, saying what to pass.
    (["--strategy", "pipeline"], LOCAL, ConfigError,
     "this run has no --devices: it would train one stage, without a pipeline. Pass "
     "--devices 2"),
    (["--strategy", "model_parallel", "--placement", "nonsense"], LOCAL, ConfigError,
     "placement"),
    (["--strategy", "model_parallel", "--devices", "3", "--tensor-parallel", "2"], LOCAL,
     ConfigError, "--tensor-parallel 2 needs --devices P*2 (P stages of 2 devices each). "
     "Received: --devices 3."),
    (["--strategy", "pipeline", "--devices", "4", "--tensor-parallel", "2", "--placement",
      "a=/cpu:0"], LOCAL, ConfigError, "Drop --placement"),
    (["--strategy", "multi_worker", "--global-batch-size", "63"],
     _tf_config(["127.0.0.1:1", "127.0.0.1:2"]), ConfigError, "not divisible"),
    (["--warmup-epochs", "1"], LOCAL, ConfigError,
     "(horovod, shm). Received: --warmup-epochs 1.0 with --strategy single"),
    (["--strategy", "parameter_server"], LOCAL, ClusterError, "needs one 'chief'"),
    # #42: chunks only under interleaving, whose micro-batches go P at a time.
    (["--strategy", "pipeline", "--devices", "2", "--microbatches", "4", "--virtual-stages",
      "2"], LOCAL, ConfigError, "only --schedule interleaved runs. Received: --schedule gpipe"),
    (["--strategy", "pipeline", "--microbatches", "6", "--schedule", "interleaved",
      "--virtual-stages", "2", "--global-batch-size", "48"],
     _tf_config(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"]), ConfigError,
     "a multiple of the 4 stages"),
    # The planner cuts the model itself; --placement names the cuts.
    (["--strategy", "pipeline", "--microbatches", "4", "--schedule", "auto", "--balance", "time",
      "--placement", "a=/cpu:0;b=/cpu:1"], LOCAL, ConfigError,
     "--schedule auto and --balance time let the planner cut the model; --placement names "
     "the cuts itself. Drop one of them."),
    (["--strategy", "pipeline", "--devices", "2", "--schedule", "fastest"], LOCAL,
     ConfigError, "auto"),
])
def test_adapters_own_their_pre_tensorflow_checks(argv, cluster, error, message):
    with pytest.raises(error) as e:
        _check(_cfg(*argv), cluster)
    assert message in str(e.value)


def test_balance_applies_to_the_pipeline_only():
    cfg = _cfg("--strategy", "model_parallel", "--devices", "2", "--balance", "time")
    with pytest.raises(ConfigError, match="--balance applies only to --strategy pipeline; "
                                          "this run uses --strategy model_parallel"):
        config.check_strategy(cfg, "model_parallel", {"model_parallel"})
    config.check_strategy(_cfg("--strategy", "pipeline", "--balance", "time"), "pipeline",
                          {"pipeline"})


def test_multi_worker_refuses_its_own_busy_port_before_tensorflow():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        cluster = _tf_config([f"127.0.0.1:{port}", "127.0.0.1:1"])
        with pytest.raises(ClusterError, match=f"cannot listen on 127.0.0.1:{port}"):
            _check(_cfg(), cluster)  # auto -> multi_worker


def test_options_that_apply_pass_the_same_checks():
    _check(_cfg("--strategy", "mirrored", "--devices", "2"), LOCAL)
    _check(_cfg("--strategy", "pipeline", "--devices", "2", "--microbatches", "4"), LOCAL)
    # auto weighs interleaving only where M is a multiple of P: M = 3 on 2 stages passes.
    _check(_cfg("--strategy", "pipeline", "--devices", "2", "--microbatches", "3",
                "--global-batch-size", "48", "--schedule", "auto", "--virtual-stages", "2",
                "--balance", "time"), LOCAL)
    _check(_cfg("--strategy", "pipeline", "--placement", "a=/cpu:0;b=/cpu:1"), LOCAL)
    _check(_cfg("--strategy", "model_parallel", "--devices", "2",
                                         "--tensor-parallel", "2"), LOCAL)
    _check(_cfg("--strategy", "pipeline", "--devices", "4",
                                         "--tensor-parallel", "2", "--microbatches", "2"), LOCAL)


def test_every_loop_kind_is_one_implementation_of_the_loop_interface():
    from tfdist.run import coordinator, loop

    assert {a.loop for a in strategies.REGISTRY.values()} == set(trainer.LOOPS)
    assert all(isinstance(impl, loop.Loop) and impl.kind == kind
               for kind, impl in trainer.LOOPS.items())
    assert isinstance(trainer.LOOPS["coordinator"], coordinator.CoordinatorLoop)
    assert loop.run_line({"a": 1, "lr": 0.05, "s": "x"}) == "a=1 lr=0.05 s=x"
