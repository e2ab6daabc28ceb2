"""A recipe's own metrics in metrics.json: `evaluate(model, cfg)`, read by loop.recipe_metrics."""

import types

import pytest

from tfdist.run import loop
from tfdist.errors import ConfigError


def _recipe(evaluate=None):
    module = types.ModuleType("r")
    module.RECIPE_FILE = "/x/r.py"
    if evaluate is not None:
        module.evaluate = evaluate
    return module


def test_no_evaluate_adds_nothing():
    assert loop.recipe_metrics(_recipe(), model=None, cfg={}, metrics={"test": {}}) == {}


def test_evaluate_gets_the_model_and_cfg_and_its_dict_is_returned():
    seen = []

    def evaluate(model, cfg):
        seen.append((model, cfg))
        return {"exact_match": 0.5, "examples": 10}

    got = loop.recipe_metrics(_recipe(evaluate), "MODEL", {"a": 1}, {"test": {}})
    assert got == {"exact_match": 0.5, "examples": 10} and seen == [("MODEL", {"a": 1})]


@pytest.mark.parametrize("evaluate, message", [
    (lambda m, c: [0.5], r"recipe /x/r\.py: evaluate\(model, cfg\) must return a dict of "
                         r"metrics for metrics\.json\. Received: list\."),
    (lambda m, c: {"test": 1.0}, r"returned \['test'\], which tfdist's metrics\.json already "
                                 r"has; rename them"),
    (lambda m, c: {"x": object()}, r"must return JSON values"),
    (3, r"recipe /x/r\.py: evaluate must be a function\. Received: int\."),
])
def test_bad_evaluate_is_a_config_error_naming_the_recipe(evaluate, message):
    with pytest.raises(ConfigError, match=message):
        loop.recipe_metrics(_recipe(evaluate), None, {}, {"test": {}})
