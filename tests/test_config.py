"""Option declarations: typed parsing, validation, repeated and unknown flags, --help."""

import math
import subprocess
import sys

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.conftest import REPO, clean_env
from tfdist import cluster, config, strategies
from tfdist.errors import ConfigError
from tfdist.option import Option

DEFAULTS = {"epochs": 5, "learning_rate": 0.1, "name": "x", "deterministic": False,
            "hidden_units": 64}


def test_types_follow_defaults():
    got = config.parse_overrides(
        ["--epochs", "3", "--learning-rate=0.5", "--name", "y", "--hidden-units", "-1"], DEFAULTS)
    assert got == {"epochs": 3, "learning_rate": 0.5, "name": "y", "hidden_units": -1}
    assert isinstance(got["learning_rate"], float)


def test_booleans():
    assert config.parse_overrides(["--deterministic"], DEFAULTS) == {"deterministic": True}
    assert config.parse_overrides(["--deterministic", "false"], DEFAULTS) == {
        "deterministic": False}
    assert config.parse_overrides(["--no-deterministic", "--epochs", "1"], DEFAULTS) == {
        "deterministic": False, "epochs": 1}


def test_unknown_key_suggests_the_closest_and_lists_known_ones():
    with pytest.raises(ConfigError, match=r"Unknown option --epoch for recipe r\. Did you mean "
                                          r"--epochs\? Known options: --deterministic, --epochs,"):
        config.parse_overrides(["--epoch", "3"], DEFAULTS, "recipe r")
    with pytest.raises(ConfigError, match=r"Unknown option --zzz for recipe r\. Known options"):
        config.parse_overrides(["--zzz", "3"], DEFAULTS, "recipe r")


@pytest.mark.parametrize("argv, message", [
    (["--epochs", "three"], r"--epochs expects an integer \(default 5\)\. Received: --epochs "
                            r"'three'"),
    (["--epochs"], r"--epochs needs a value"),
    (["--deterministic", "maybe"], r"Expected an option like --key value\. Received: 'maybe'"),
    (["epochs", "3"], r"Received: 'epochs'"),
    (["--epochs", "3", "--epochs", "4"],
     r"--epochs is given twice \(--epochs 3, then --epochs 4\); give it once"),
    (["--deterministic", "--no-deterministic"],
     r"--deterministic is given twice \(--deterministic, then --no-deterministic\)"),
    (["--epochs=3", "--epochs", "3"], r"--epochs is given twice \(--epochs=3, then --epochs 3\)"),
    (["--epochs", "٣"], r"--epochs expects an integer"),       # non-ASCII digit
    (["--epochs", "1_000"], r"--epochs expects an integer"),
    (["--epochs", "9" * 5000], r"--epochs expects an integer"),
    (["--learning-rate", "0x10"], r"--learning-rate expects a number"),
])
def test_bad_values(argv, message):
    with pytest.raises(ConfigError, match=message):
        config.parse_overrides(argv, DEFAULTS)


# The examples of issue 13, each refused with the option and the value received.
ISSUE_EXAMPLES = [
    (["--steps-per-epoch", "-5"], "--steps-per-epoch must be >= 0. Received: --steps-per-epoch -5."),
    (["--test-fraction", "2"], "--test-fraction must be < 1. Received: --test-fraction 2.0."),
    (["--epochs", "-1"], "--epochs must be >= 1. Received: --epochs -1."),
    (["--epochs", "0"], "--epochs must be >= 1. Received: --epochs 0."),
    (["--learning-rate", "nan"], "--learning-rate must be a finite number. Received: "
                                 "--learning-rate nan."),
    (["--learning-rate", "inf"], "--learning-rate must be a finite number."),
    (["--learning-rate", "-1"], "--learning-rate must be > 0. Received: --learning-rate -1.0."),
    (["--momentum", "nan"], "--momentum must be a finite number. Received: --momentum nan."),
    (["--devices", "-2"], "--devices must be >= 0. Received: --devices -2."),
    (["--shuffle-buffer", "-1"], "--shuffle-buffer must be >= 0. Received: --shuffle-buffer -1."),
    (["--collective-timeout-s", "-1"], "--collective-timeout-s must be > 0. Received: "
                                       "--collective-timeout-s -1.0."),
    (["--collective", "magic"], "--collective must be one of auto, ring, nccl. Received: "
                                "--collective 'magic'."),
    (["--verbose", "7"], "--verbose must be one of auto, 0, 1, 2. Received: --verbose '7'."),
    (["--keep", "0"], "--keep must be >= 1. Received: --keep 0."),
    (["--epochs", "2", "--epochs", "3"], "--epochs is given twice (--epochs 2, then --epochs 3)"),
    (["--threads", "-1"], "--threads must be >= 0. Received: --threads -1."),
    (["--seed", "-1"], "--seed must be >= 0. Received: --seed -1."),
    (["--hidden-units", "0"], "--hidden-units must be >= 1. Received: --hidden-units 0."),
    (["--optimizer", "magic"], "--optimizer must be one of sgd, adam, "),
]


@pytest.mark.parametrize("argv, message", ISSUE_EXAMPLES)
def test_issue_examples_are_refused_naming_option_and_value(argv, message):
    from tfdist import recipe

    digits = recipe.load("digits_mlp")
    with pytest.raises(ConfigError) as e:
        config.merge(digits.DECLARED, argv, "recipe digits_mlp")
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_merge_recipe_over_framework():
    cfg = config.merge({"epochs": 2, "learning_rate": 1, "hidden_units": 8},
                       ["--hidden-units", "16"], "recipe r")
    assert cfg["epochs"] == 2 and cfg["hidden_units"] == 16
    assert cfg["learning_rate"] == 1.0 and isinstance(cfg["learning_rate"], float)
    assert cfg["strategy"] == "auto" and isinstance(cfg, dict)
    assert cfg.given == {"hidden_units"}
    with pytest.raises(ConfigError, match=r"recipe r sets DEFAULTS: --epochs must be an integer, "
                                          r"not str\. Received: --epochs '2'"):
        config.merge({"epochs": "2"}, [], "recipe r")
    with pytest.raises(ConfigError, match=r"recipe r sets DEFAULTS: --epochs must be >= 1"):
        config.merge({"epochs": 0}, [], "recipe r")
    with pytest.raises(ConfigError, match=r"recipe r: DEFAULTS must be a dict"):
        config.merge([("epochs", 2)], [], "recipe r")
    with pytest.raises(ConfigError, match=r"DEFAULTS\['layers'\] must be a bool, int, float or "
                                          r"str\. Received: list"):
        config.merge({"layers": [1, 2]}, [], "recipe r")


def test_recipe_declarations_give_range_and_help():
    declared = {"width": Option(8, "units per layer", ge=1, le=64), "tag": "a"}
    assert config.merge(declared, ["--width", "64"], "recipe r")["width"] == 64
    with pytest.raises(ConfigError, match=r"--width must be <= 64\. Received: --width 65"):
        config.merge(declared, ["--width", "65"], "recipe r")
    with pytest.raises(ConfigError, match=r"recipe r sets DEFAULTS: --width must be >= 1"):
        config.merge({"width": Option(0, ge=1)}, [], "recipe r")
    with pytest.raises(ConfigError, match=r"re-declares tfdist's option --epochs"):
        config.merge({"epochs": Option(3)}, [], "recipe r")
    text = config.usage(config.declarations(declared, "recipe r"), "r")
    assert "recipe r options:" in text
    width = text[text.index("--width"):]
    assert "units per layer" in width and "default 8; >= 1; <= 64" in width


def test_every_framework_option_is_declared_with_meaning():
    assert config.FRAMEWORK_DEFAULTS == {k: o.default for k, o in config.OPTIONS.items()}
    for key, option in config.OPTIONS.items():
        assert option.name == key and option.help, key
        assert option.check(option.default) == option.default, key  # defaults are valid
        for name in option.strategies or ():
            assert name in strategies.REGISTRY, (key, name)


def test_help_shows_meaning_default_choices_strategies():
    text = config.usage(config.OPTIONS)
    collective = text[text.index("--collective "):]
    assert collective.startswith("--collective {auto|ring|nccl}")
    assert "MultiWorkerMirroredStrategy" in collective.split("--collective-timeout-s")[0]
    assert "default 'auto'; one of auto, ring, nccl; --strategy multi_worker only" in collective
    assert "default 1; >= 1" in text[text.index("--epochs"):]


def _info(**env):
    return cluster.detect(env)


@pytest.mark.parametrize("argv, strategy_env, message", [
    (["--collective", "ring"], {}, "--collective applies only to --strategy multi_worker; this "
     "run uses --strategy auto (auto resolves to mirrored or single here). Received: "
     "--collective 'ring'."),
    (["--strategy", "single", "--microbatches", "4"], {},
     "--microbatches applies only to --strategy pipeline; this run uses --strategy single."),
    (["--strategy", "mirrored", "--ps-shards", "2"], {},
     "--ps-shards applies only to --strategy parameter_server; this run uses --strategy mirrored"),
    (["--strategy", "shm", "--placement", "a=/cpu:0"], {},
     "--placement applies only to --strategy model_parallel, pipeline;"),
    (["--strategy", "mirrored", "--devices", "2", "--tensor-parallel", "2"], {},
     "--tensor-parallel applies only to --strategy model_parallel, pipeline; this run uses "
     "--strategy mirrored."),
])
def test_options_that_do_not_apply_are_refused(argv, strategy_env, message):
    cfg = config.merge({}, argv, "recipe r")
    info = _info(**strategy_env)
    with pytest.raises(ConfigError) as e:
        config.check_strategy(cfg, cfg["strategy"], strategies.possible_names(
            cfg["strategy"], info, cfg["devices"] or None))
    assert message in str(e.value)


@pytest.mark.parametrize("defaults, argv, env", [
    ({}, ["--collective", "ring"], {"TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:1"]}, '
                                                 '"task": {"type": "worker", "index": 0}}'}),
    ({}, ["--strategy", "multi_worker", "--collective-timeout-s", "5"], {}),
    ({}, ["--strategy", "shm", "--collective-timeout-s", "5"], {}),
    ({}, ["--devices", "2"], {}),  # auto -> mirrored
    ({"strategy": "model_parallel", "devices": 2}, ["--strategy", "single"], {}),  # recipe's own
])
def test_options_that_apply_are_accepted(defaults, argv, env):
    cfg = config.merge(defaults, argv, "recipe r")
    config.check_strategy(cfg, cfg["strategy"], strategies.possible_names(
        cfg["strategy"], _info(**env), cfg["devices"] or None))


@pytest.mark.integration
def test_config_layer_imports_no_tensorflow():
    code = ("import sys; from tfdist import config, recipe; "
            "config.merge(recipe.load('digits_mlp').DECLARED, ['--epochs', '2'], 'r'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'keras')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=clean_env(), cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# --- property-based: no input escapes as anything but ConfigError --------------------

_TOKENS = st.one_of(
    st.sampled_from(["--epochs", "--learning-rate", "--strategy", "--deterministic",
                     "--no-deterministic", "--no-epochs", "--", "-", "--=", "--epochs=",
                     "nan", "-inf", "1e309", "-0", "٣", "²", "true", "3", "-5", "0.5"]),
    st.text(max_size=12),
    st.from_regex(r"--[a-z\-]{0,20}(=.{0,8})?", fullmatch=True),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_TOKENS, max_size=6))
def test_any_argv_is_parsed_or_refused(argv):
    try:
        cfg = config.merge({"hidden_units": Option(4, ge=1)}, argv, "recipe r")
    except ConfigError as e:
        assert str(e) and "\n" not in str(e)
        return
    for key, value in cfg.items():  # whatever got through is declared, typed and in range
        assert cfg.options[key].check(value) == value
        if isinstance(value, float):
            assert math.isfinite(value)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(config.OPTIONS)), st.text(max_size=40))
@example("accumulate", "0\x1f")  # whitespace that int() refuses
@example("learning_rate", "0.5\x1f")
def test_any_value_string_is_parsed_or_refused(key, raw):
    option = config.OPTIONS[key]
    try:
        value = option.parse(raw)
    except ConfigError as e:
        assert e.args[0].startswith(f"--{key.replace('_', '-')} ")
        return
    assert type(value) is option.kind and option.check(value) == value


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=8), st.one_of(
    st.integers(), st.floats(), st.text(max_size=5), st.booleans(), st.none(),
    st.lists(st.integers(), max_size=2)), max_size=4))
def test_any_recipe_defaults_are_accepted_or_refused(defaults):
    try:
        config.merge(defaults, [], "recipe r")
    except ConfigError as e:
        assert str(e).startswith("recipe r")


def test_keras_verbosity_auto_follows_the_terminal():
    from tfdist.config import keras_verbosity

    assert keras_verbosity("auto", interactive=True) == 1
    assert keras_verbosity("auto", interactive=False) == 2
    assert keras_verbosity("0", interactive=True) == 0 and keras_verbosity(2, False) == 2
    with pytest.raises(ConfigError, match=r"--verbose must be one of .* Received: 'loud'"):
        keras_verbosity("loud", interactive=False)
