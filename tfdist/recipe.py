"""Finding and loading recipes ("what to train").

A recipe is a small Python module with:

* ``DEFAULTS``: a dict of options (may override framework ones such as
  ``epochs``, ``global_batch_size``, ``learning_rate``);
* ``build_model(cfg)``: an uncompiled Keras model;
* ``build_dataset(cfg, split)``: unbatched (x, y) examples for "train" or
  "test", as a `tf.data.Dataset` or a `tfdist.data.Source`;
* optionally ``compile_kwargs(cfg)``: loss and metrics for `model.compile`.

Recipes import Keras/TensorFlow inside these functions, so that loading one
to validate options does not start TensorFlow. Recipes know nothing of
distribution.
"""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

from tfdist.errors import ConfigError

RECIPES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "recipes")
REQUIRED = ("DEFAULTS", "build_model", "build_dataset")


def available() -> list[str]:
    """Names of the recipes shipped in `recipes/`."""
    if not os.path.isdir(RECIPES_DIR):
        return []
    return sorted(f[:-3] for f in os.listdir(RECIPES_DIR)
                  if f.endswith(".py") and not f.startswith("_"))


def resolve_path(name_or_path: str) -> str:
    """The file of a recipe given by name (in `recipes/`) or by path.

    Raises:
        ConfigError: naming what was received and the available recipes.
    """
    if name_or_path.endswith(".py") or os.sep in name_or_path:
        if os.path.isfile(name_or_path):
            return os.path.abspath(name_or_path)
        raise ConfigError(f"Recipe file {name_or_path!r} does not exist. "
                          f"Available recipes: {available()}.")
    path = os.path.join(RECIPES_DIR, f"{name_or_path}.py")
    if not os.path.isfile(path):
        raise ConfigError(f"Recipe {name_or_path!r} not found. Available recipes: "
                          f"{available()} (or pass a path to a recipe .py file).")
    return path


def load(name_or_path: str) -> ModuleType:
    """Imports a recipe module and checks its interface.

    Raises:
        ConfigError: when the recipe is missing or lacks a required member.
    """
    path = resolve_path(name_or_path)
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(f"tfdist_recipe_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    missing = [attr for attr in REQUIRED if not hasattr(module, attr)]
    if missing:
        raise ConfigError(f"Recipe {path} is missing {missing}; a recipe defines "
                          f"{list(REQUIRED)}.")
    module.RECIPE_NAME = name
    return module


def compile_kwargs(recipe: ModuleType, cfg: dict) -> dict:
    """The recipe's loss and metrics for `model.compile` ({} when it defines none)."""
    return recipe.compile_kwargs(cfg) if hasattr(recipe, "compile_kwargs") else {}
