"""Optimizer construction from the run's options."""

import dataclasses

import pytest

from tfdist import config, optim
from tfdist.errors import ConfigError


def _cfg(**over):
    return config.merge({}, [f"--{k.replace('_', '-')}={v}" for k, v in over.items()], "test")


def _opt(**over):
    """The Optimization section of a configuration with `over` set."""
    from tfdist.settings import Settings

    return Settings.of(_cfg(**over)).optimization


def test_lamb_with_clipping_accumulation_and_schedule():
    opt = optim.build_optimizer(_opt(optimizer="lamb", clipnorm=0.5, accumulate=4,
                                     warmup_steps=10), 0.01)
    assert type(opt).__name__ == "Lamb"
    assert opt.global_clipnorm == 0.5 and opt.gradient_accumulation_steps == 4
    assert type(opt._learning_rate).__name__ == "WarmupSchedule"


def test_sgd_gets_momentum_and_plain_lr():
    opt = optim.build_optimizer(_opt(momentum=0.9), 0.1)
    assert type(opt).__name__ == "SGD" and opt.momentum == 0.9
    assert float(opt.learning_rate) == pytest.approx(0.1)
    assert opt.global_clipnorm is None and not opt.gradient_accumulation_steps


def test_unknown_optimizer_lists_valid_ones():
    with pytest.raises(ConfigError, match=r"Unknown optimizer 'sgdd'\. Valid: \[.*'lamb'.*'sgd'"):
        optim.build_optimizer(dataclasses.replace(_opt(), optimizer="sgdd"), 0.1)  # no CLI check
    with pytest.raises(ConfigError, match=r"--optimizer must be one of sgd, adam, .*Received: "
                                          r"--optimizer 'sgdd'"):
        _cfg(optimizer="sgdd")


@pytest.mark.parametrize("over, message", [
    ({"accumulate": 0}, r"--accumulate must be >= 1\. Received: --accumulate 0"),
    ({"clipnorm": -1}, r"--clipnorm must be >= 0"),
    ({"precision": "fp8"}, r"--precision must be one of float32, mixed_float16, mixed_bfloat16\. "
                           r"Received: --precision 'fp8'"),
    ({"lr_schedule": "noam"}, r"lr schedule 'noam' needs --warmup-steps > 0"),
])
def test_bad_options(over, message):
    with pytest.raises(ConfigError, match=message):
        optim.check(_opt(**over))


def test_optimizer_choices_are_keras_optimizers():
    # --optimizer is checked against a fixed list before Keras is imported; it must not
    # name a class the supported Keras lacks.
    assert set(config.OPTIMIZERS) <= set(optim.optimizer_classes())
