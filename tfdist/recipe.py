"""Finding and loading recipes ("what to train").

A recipe is a small Python module with:

* ``DEFAULTS``: a dict of options (may override framework ones such as
  ``epochs``, ``global_batch_size``, ``learning_rate``);
* ``build_model(cfg)``: an uncompiled Keras model;
* ``build_dataset(cfg, split)``: unbatched (x, y) examples for "train" or
  "test", as a `tf.data.Dataset` or a `tfdist.data.Source`;
* optionally ``compile_kwargs(cfg)``: loss and metrics for `model.compile`;
* optionally ``build_optimizer(cfg, learning_rate)``: the Keras optimizer
  (default: `tfdist.optim.build_optimizer`, from --optimizer, --momentum,
  --clipnorm, --accumulate, --warmup-steps); `learning_rate` is already
  scaled by --lr-scaling;
* optionally ``callbacks(cfg)``: extra Keras callbacks for `fit`, run on
  every worker (write files only where `cfg["is_chief"]`);
* optionally ``train_step(model, data)``: one training step, as the body of
  Keras 3's `Model.train_step(self, data)` (forward, loss, gradients,
  `model.optimizer.apply`, metrics); returns the logs dict. It runs on every
  replica inside `fit`; the optimizer all-reduces the gradients.

`recipes/TEMPLATE.py` is a copyable recipe with every member. Recipes import Keras/TensorFlow inside these functions, so that loading one
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


def build_optimizer(recipe: ModuleType, cfg: dict, learning_rate: float):
    """The recipe's optimizer, or tfdist's from the options when it defines none."""
    if hasattr(recipe, "build_optimizer"):
        return recipe.build_optimizer(cfg, learning_rate)
    from tfdist import optim

    return optim.build_optimizer(cfg, learning_rate)


def callbacks(recipe: ModuleType, cfg: dict, is_chief: bool) -> list:
    """The recipe's extra `fit` callbacks ([] when it defines none)."""
    if not hasattr(recipe, "callbacks"):
        return []
    return list(recipe.callbacks({**cfg, "is_chief": is_chief}))


def install_train_step(recipe: ModuleType, model) -> None:
    """Makes `fit` run the recipe's `train_step(model, data)`, if it has one."""
    if hasattr(recipe, "train_step"):
        step = recipe.train_step
        # Keras's fit calls self.train_step(data); an instance attribute overrides the method.
        model.train_step = lambda data: step(model, data)


HOOKS_WITHOUT_FIT = ("callbacks", "train_step")


def check_hooks_for_own_loop(recipe: ModuleType, loop: str) -> None:
    """Refuses `fit`-only hooks for loops that are not Keras `fit` (parameter server).

    Raises:
        ConfigError: naming the hooks and the loop.
    """
    used = [h for h in HOOKS_WITHOUT_FIT if hasattr(recipe, h)]
    if used:
        raise ConfigError(f"Recipe {recipe.RECIPE_NAME} defines {used}, which run inside Keras "
                          f"`fit`; {loop} has its own training loop and cannot use them. "
                          "Use a synchronous strategy, or drop them.")
