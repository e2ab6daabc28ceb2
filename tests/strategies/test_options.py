"""Each option is declared once; the command line's table, `tfdist.setup()`'s keywords
and `Settings` are derived from that declaration (pure, no TensorFlow)."""

import ast
import dataclasses
import os

from tests.conftest import REPO
from tfdist import config, instruments, settings, strategies, straggler  # noqa: F401
from tfdist.option import Option


def _declarations(path: str) -> list[tuple[str, int]]:
    """(key, line) for every option declared in `path`: a `"key": Option(...)` entry of a
    dict, or a class field `key: T = f(Option(...))` / `= Option(...)` (pure: reads the file)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)

    def is_option(node) -> bool:
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "Option")

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            out += [(k.value, k.lineno) for k, v in zip(node.keys, node.values)
                    if isinstance(k, ast.Constant) and is_option(v)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and (
                is_option(node.value) or isinstance(node.value, ast.Call)
                and any(is_option(a) for a in node.value.args)):
            out.append((node.target.id, node.lineno))
    return out


def _every_declaration() -> dict[str, list[str]]:
    """key -> 'file:line' of each place in tfdist/ that declares it."""
    found: dict[str, list[str]] = {}
    root = os.path.join(REPO, "tfdist")
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                for key, line in _declarations(path):
                    found.setdefault(key, []).append(f"{os.path.relpath(path, REPO)}:{line}")
    return found


def test_every_option_is_declared_in_exactly_one_place():
    found = _every_declaration()
    twice = {k: where for k, where in found.items() if len(where) > 1}
    assert twice == {}
    # What is declared is what the command line knows: the framework's table and the
    # registered instruments' options (the benchmarks' straggler), nothing more.
    assert set(found) == set(config.OPTIONS) | set(instruments.options())
    # The adapters' options are declared with their fields, not in the table.
    assert all(w[0].startswith("tfdist/strategies/options.py:")
               for k, w in found.items() if k in strategies.ADAPTER_OPTIONS)


def test_the_declaration_check_sees_both_kinds_of_declaration(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('T = {"epochs": Option(5), "x": 3}\n'
                     'class S:\n    devices: int = _declared(Option(0))\n    plain: int = 0\n')
    assert _declarations(str(probe)) == [("epochs", 1), ("devices", 3)]


def test_the_table_setup_and_settings_are_derived_from_the_adapters_fields():
    fields = dataclasses.fields(strategies.StrategyOptions)
    declared = {f.name: f.metadata["option"] for f in fields}
    assert declared == strategies.ADAPTER_OPTIONS
    for key, option in declared.items():
        assert isinstance(option, Option) and option.name == key  # one name, no renaming
        assert config.OPTIONS[key] is option  # the table holds the declaration, not a copy
        assert config.FRAMEWORK_DEFAULTS[key] == option.default
        assert getattr(strategies.StrategyOptions(), key) == option.default
    # setup() takes every adapter option, and this process's runtime.
    assert set(config.SCRIPT_OPTIONS) == {*declared, "threads", "inter_op_threads", "tf_logs"}
    # Settings: the adapters' section is StrategyOptions itself, keyed as on the command line.
    s = config.merge({}, ["--collective-timeout-s", "9", "--microbatches", "2"], "r").typed
    assert isinstance(s.adapter, strategies.StrategyOptions)
    assert (s.adapter.collective_timeout_s, s.adapter.microbatches) == (9.0, 2)
    assert all(s.value(k) == getattr(s.adapter, k) for k in declared)


def test_one_convention_for_devices_zero_is_all():
    assert strategies.StrategyOptions().devices == 0
    assert strategies.StrategyOptions(devices=None).devices == 0  # None: the default
    assert config.merge({}, [], "r").typed.adapter.devices == 0
    assert config.for_script("auto", {"devices": None}).typed.adapter.devices == 0
    from tfdist.cluster import detect

    local = strategies.choose("auto", detect({}), 0)
    assert local.resolve(gpus=2).name == "mirrored"  # 0: every GPU
    assert strategies.resolve_name("auto", local.cluster, 0, gpus=0) == "single"


def test_an_old_setup_keyword_is_named_by_its_declaration():
    import pytest

    from tfdist.errors import ConfigError

    assert strategies.ADAPTER_OPTIONS["collective_timeout_s"].old_names == ("timeout_s",)
    with pytest.raises(ConfigError, match=r"no option timeout_s=\. Did you mean "
                                          r"collective_timeout_s=\?"):
        config.for_script("auto", {"timeout_s": 5})


def test_setup_names_its_arguments_as_keywords_not_flags():
    """#48: `tfdist.setup('mirror')` was refused as `--strategy 'mirror'`."""
    import pytest

    from tfdist.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        config.for_script("mirror", {})
    assert str(e.value).startswith("tfdist.setup(): strategy must be one of auto, single, "
                                   "mirrored, ")
    assert str(e.value).endswith(". Received: strategy='mirror'.") and "--" not in str(e.value)
    with pytest.raises(ConfigError, match=r"Received: devices='2'\.$"):
        config.for_script("mirrored", {"devices": "2"})


def test_setup_takes_the_pipelines_schedule_options_as_the_command_line_does():
    """`tfdist.setup(virtual_stages=..., schedule="auto", balance="time")`: #42's fields."""
    import pytest

    from tfdist.errors import ConfigError

    cfg = config.for_script("pipeline", {"devices": 2, "microbatches": 4,
                                         "schedule": "interleaved", "virtual_stages": 2})
    assert (cfg.typed.adapter.schedule, cfg.typed.adapter.virtual_stages) == ("interleaved", 2)
    config.check_strategy(cfg, "pipeline", {"pipeline"})
    auto = config.for_script("pipeline", {"schedule": "auto", "balance": "time"}).typed.adapter
    assert (auto.schedule, auto.balance) == ("auto", "time")
    with pytest.raises(ConfigError, match=r"^tfdist.setup\(\): virtual_stages must be >= 1\. "
                                          r"Received: virtual_stages=0\.$"):
        config.for_script("pipeline", {"virtual_stages": 0})
    with pytest.raises(ConfigError, match="balance"):
        config.for_script("pipeline", {"balance": "layers"})
    single = config.for_script("single", {"virtual_stages": 2})
    with pytest.raises(ConfigError, match="--virtual-stages applies only to --strategy "
                                          "pipeline"):
        config.check_strategy(single, "single", {"single"})
