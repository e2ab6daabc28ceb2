"""Typed overrides against recipe defaults."""

import pytest

from tfdist import config
from tfdist.errors import ConfigError

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


def test_unknown_key_lists_known_ones():
    with pytest.raises(ConfigError, match=r"Unknown option --epoch for recipe r\. Known "
                                          r"options: --deterministic, --epochs, "):
        config.parse_overrides(["--epoch", "3"], DEFAULTS, "recipe r")


@pytest.mark.parametrize("argv, message", [
    (["--epochs", "three"], r"--epochs expects a int \(default 5\)\. Received: 'three'"),
    (["--epochs"], r"--epochs needs a value"),
    (["--deterministic", "maybe"], r"Expected an option like --key value\. Received: 'maybe'"),
    (["epochs", "3"], r"Received: 'epochs'"),
])
def test_bad_values(argv, message):
    with pytest.raises(ConfigError, match=message):
        config.parse_overrides(argv, DEFAULTS)


def test_merge_recipe_over_framework():
    cfg = config.merge({"epochs": 2, "learning_rate": 1, "hidden_units": 8},
                       ["--hidden-units", "16"], "recipe r")
    assert cfg["epochs"] == 2 and cfg["hidden_units"] == 16
    assert cfg["learning_rate"] == 1.0 and isinstance(cfg["learning_rate"], float)
    assert cfg["strategy"] == "auto"
    with pytest.raises(ConfigError, match=r"recipe r sets epochs='2' \(str\)"):
        config.merge({"epochs": "2"}, [], "recipe r")


def test_keras_verbosity_auto_follows_the_terminal():
    from tfdist.config import keras_verbosity

    assert keras_verbosity("auto", interactive=True) == 1
    assert keras_verbosity("auto", interactive=False) == 2
    assert keras_verbosity("0", interactive=True) == 0 and keras_verbosity(2, False) == 2
    with pytest.raises(ConfigError, match=r"--verbose must be one of .* Received: 'loud'"):
        keras_verbosity("loud", interactive=False)
