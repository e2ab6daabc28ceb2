"""The typed view of the configuration: every option in exactly one section (pure)."""

import dataclasses

import pytest

from tfdist import config, settings, strategies


def test_every_framework_option_has_exactly_one_home():
    homes = ["strategy", *settings.section_keys(), *strategies.ADAPTER_OPTIONS]
    assert sorted(homes) == sorted(config.OPTIONS)  # none missing, none twice


def test_the_adapters_section_holds_what_the_adapters_accept():
    fields = [f.name for f in dataclasses.fields(strategies.StrategyOptions)]
    assert fields == list(strategies.ADAPTER_OPTIONS)  # one name: the field is the option
    for adapter in strategies.REGISTRY.values():
        assert set(adapter.accepts) <= set(fields), adapter.name


def test_built_once_from_the_merged_dict_which_still_reads_by_key():
    cfg = config.merge({"hidden": 32, "epochs": 3},
                       ["--strategy", "multi_worker", "--collective-timeout-s", "7",
                        "--learning-rate", "0.2", "--no-csv-log"], "recipe r")
    s = settings.Settings.of(cfg)
    assert cfg["epochs"] == 3 and cfg["hidden"] == 32  # the dict as before
    assert s.strategy == "multi_worker" and s.training.epochs == 3
    assert s.optimization.learning_rate == 0.2 and s.logs.csv_log is False
    assert s.adapter.collective_timeout_s == 7.0 and s.adapter.devices == 0  # 0: all devices
    assert s.recipe == {"hidden": 32}
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.training.epochs = 4  # type: ignore[misc]
    assert config.merge({}, ["--devices", "2"], "r").typed.adapter.devices == 2


def test_benchmark_knobs_are_the_benchs_own_registered_options():
    from tfdist import instruments
    from tfdist.run import run_dir, trainer
    from tfdist import straggler
    from tfdist.cluster import detect
    from tfdist.errors import ConfigError

    assert "straggler_delay_ms" not in config.OPTIONS  # not the framework's
    assert set(straggler.Straggler.options) <= set(instruments.options())
    cfg = config.merge({}, ["--straggler-delay-ms", "20", "--straggler-worker", "1"], "r")
    s = settings.Settings.of(cfg)
    assert (s.instruments.straggler_delay_ms, s.instruments.straggler_worker) == (20, 1)
    assert instruments.active(s.instruments) == [i for i in instruments.REGISTERED
                                                 if isinstance(i, straggler.Straggler)]
    assert not s.recipe and s.value("straggler_worker") == 1 and s.value("devices") == 0
    assert "straggler_delay_ms" not in run_dir.run_config(cfg)  # never what a run computes
    text = config.usage(config.declarations({}, "r"))
    assert text.index("instrumentation options (benchmarks):") < text.index("--straggler-delay-ms")
    # The run pipeline checks it through the registration (one worker: index 1 is out).
    with pytest.raises(ConfigError, match=r"--straggler-worker must be in \[0, 1\)"):
        trainer.check_before_tensorflow(s, detect({}))


@pytest.mark.integration
def test_the_framework_alone_does_not_know_the_benchmark_knobs():
    import subprocess
    import sys

    from tests.conftest import REPO, clean_env

    code = ("from tfdist import config; from tfdist.errors import ConfigError\n"
            "try:\n    config.merge({}, ['--straggler-delay-ms', '5'], 'r')\n"
            "except ConfigError as e:\n    print('refused', 'Unknown option' in str(e))\n"
            "import tfdist.train\n"
            "print(config.merge({}, ['--straggler-delay-ms', '5'], 'r')['straggler_delay_ms'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=clean_env(), cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["refused", "True", "5"]


def test_one_declaration_per_default_for_the_cli_the_library_and_own_scripts():
    """`tfdist.setup()`, `build_strategy` (StrategyOptions()) and the command line
    read the same defaults: a default changed in one place changes all three."""
    from tfdist import strategies

    cli = config.merge({}, [], "r").typed
    script = config.for_script("auto", {}).typed
    assert script.adapter == cli.adapter == strategies.StrategyOptions()
    assert script.runtime == cli.runtime and script.logs == cli.logs
    for key, option in strategies.ADAPTER_OPTIONS.items():
        assert config.OPTIONS[key] is option, key
        assert getattr(strategies.StrategyOptions(), key) == option.default, key
    # The disagreement #27 found: setup() waited 300 s on a silent collective, the CLI 60.
    assert script.adapter.collective_timeout_s == config.OPTIONS["collective_timeout_s"].default


def test_setup_options_are_the_command_lines_checked_the_same_way():
    from tfdist.errors import ConfigError

    s = config.for_script("pipeline", {"microbatches": 4, "collective_timeout_s": 5,
                                       "threads": 1, "devices": None}).typed
    assert (s.adapter.microbatches, s.adapter.collective_timeout_s, s.runtime.threads) == \
        (4, 5.0, 1)
    assert s.adapter.devices == 0  # None: the default, 0 (all devices)
    with pytest.raises(ConfigError, match=r"no option timeout_s=\. Did you mean "
                                          r"collective_timeout_s=\?"):
        config.for_script("auto", {"timeout_s": 5})
    with pytest.raises(ConfigError, match=r"microbatches must be >= 1\. Received: "
                                          r"microbatches=0"):
        config.for_script("pipeline", {"microbatches": 0})
    with pytest.raises(ConfigError, match="strategy must be one of"):
        config.for_script("mirored", {})
    # A value other than the default is refused where the strategy cannot use it;
    # the default passed on (a script forwarding every option) is not.
    cfg = config.for_script("single", {"microbatches": 4})
    with pytest.raises(ConfigError, match=r"--microbatches applies only to --strategy pipeline"):
        config.check_strategy(cfg, "single", {"single"})
    config.check_strategy(config.for_script("single", {"microbatches": 1}), "single",
                          {"single"})


def _reads_by_key(path: str) -> list[int]:
    """Lines of `path` that read a configuration dict by key: cfg[...] or cfg.get(...)."""
    import ast

    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    lines = []
    for node in ast.walk(tree):
        target = (node.value if isinstance(node, ast.Subscript) else
                  node.func.value if isinstance(node, ast.Call)
                  and isinstance(node.func, ast.Attribute) and node.func.attr == "get" else None)
        if isinstance(target, ast.Name) and target.id == "cfg":
            lines.append(node.lineno)
    return lines


def test_no_configuration_read_by_key_outside_the_option_and_settings_modules():
    """Everything in tfdist reads `Settings`; only the modules that build it read the dict
    (recipes, which are given `cfg`, are the user's code and may)."""
    import os

    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tfdist")
    allowed = {os.path.join(root, m) for m in ("config.py", "settings.py", "option.py")}
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            if name.endswith(".py") and path not in allowed and _reads_by_key(path):
                found[os.path.relpath(path, root)] = _reads_by_key(path)
    assert found == {}
    # The check sees such reads at all.
    assert _reads_by_key(os.path.join(root, "settings.py"))
