"""Recipe lookup by name and path."""

import pytest

from tfdist import recipe
from tfdist.errors import ConfigError


def test_shipped_recipes_load():
    assert "digits_mlp" in recipe.available()
    module = recipe.load("digits_mlp")
    assert module.RECIPE_NAME == "digits_mlp" and "hidden_units" in module.DEFAULTS


def test_load_by_path():
    assert recipe.load(recipe.resolve_path("digits_mlp")).RECIPE_NAME == "digits_mlp"


def test_unknown_recipe_lists_available():
    with pytest.raises(ConfigError, match=r"Recipe 'digitz' not found\. Available recipes: "
                                          r"\[.*'digits_mlp'"):
        recipe.load("digitz")
    with pytest.raises(ConfigError, match=r"Recipe file 'nope/x\.py' does not exist"):
        recipe.load("nope/x.py")


def test_recipe_missing_members(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text("DEFAULTS = {}\n")
    with pytest.raises(ConfigError, match=r"missing \['build_model', 'build_dataset'\]"):
        recipe.load(str(path))


def test_fit_only_hooks_are_refused_for_parameter_server():
    recipe_lib = recipe
    template = recipe_lib.load("TEMPLATE")
    with pytest.raises(ConfigError, match=r"defines \['callbacks', 'train_step'\].*"
                                          "parameter_server has its own training loop"):
        recipe_lib.check_hooks_for_own_loop(template, "parameter_server")
    recipe_lib.check_hooks_for_own_loop(recipe_lib.load("digits_mlp"), "parameter_server")
