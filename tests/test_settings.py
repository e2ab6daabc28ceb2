"""The typed view of the configuration: every option in exactly one section (pure)."""

import dataclasses

import pytest

from tfdist import config, settings, strategies


def test_every_framework_option_has_exactly_one_home():
    homes = ["strategy", *settings.section_keys(), *strategies.OPTION_FIELDS]
    assert sorted(homes) == sorted(config.OPTIONS)  # none missing, none twice


def test_the_adapters_section_holds_what_the_adapters_accept():
    fields = {f.name for f in dataclasses.fields(strategies.StrategyOptions)}
    assert set(strategies.OPTION_FIELDS.values()) <= fields
    for adapter in strategies.REGISTRY.values():
        assert set(adapter.accepts) <= set(strategies.OPTION_FIELDS), adapter.name


def test_built_once_from_the_merged_dict_which_still_reads_by_key():
    cfg = config.merge({"hidden": 32, "epochs": 3},
                       ["--strategy", "multi_worker", "--collective-timeout-s", "7",
                        "--learning-rate", "0.2", "--no-csv-log"], "recipe r")
    s = settings.Settings.of(cfg)
    assert cfg["epochs"] == 3 and cfg["hidden"] == 32  # the dict as before
    assert s.strategy == "multi_worker" and s.training.epochs == 3
    assert s.optimization.learning_rate == 0.2 and s.logs.csv_log is False
    assert s.adapter.timeout_s == 7.0 and s.adapter.devices is None  # 0: all devices
    assert s.recipe == {"hidden": 32}
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.training.epochs = 4  # type: ignore[misc]
    assert config.merge({}, ["--devices", "2"], "r").typed.adapter.devices == 2
