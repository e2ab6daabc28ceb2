"""Finding, loading and checking recipes ("what to train").

A recipe is a small Python module with:

* ``DEFAULTS``: a dict of options (may override framework ones such as
  ``epochs``, ``global_batch_size``, ``learning_rate``); a recipe's own option
  may be a `tfdist.option.Option` giving its meaning and range;
* ``build_model(cfg)``: an uncompiled Keras model;
* ``build_dataset(cfg, split)``: unbatched (x, y) examples for "train" or
  "test", as a `tf.data.Dataset` or a `tfdist.data.Source`;
* optionally ``check_config(cfg)``: the recipe's own checks of its options
  that need no TensorFlow (a data dir holds its files, sizes agree); raises
  ConfigError, before TensorFlow starts and before anything is written;
* ``compile_kwargs(cfg)``: loss and metrics for `model.compile` (no optimizer:
  see build_optimizer); required unless the recipe has its own train_step;
* optionally ``build_optimizer(cfg, learning_rate)``: the Keras optimizer
  (default: `tfdist.optim.build_optimizer`, from --optimizer, --momentum,
  --clipnorm, --accumulate, --warmup-steps); `learning_rate` is already
  scaled by --lr-scaling;
* optionally ``callbacks(cfg)``: extra Keras callbacks for `fit`, run on
  every worker (write files through `cfg["writer"]`, the run's chief-only
  writer, e.g. `cfg["writer"].write_text("notes.txt", text)`; print only
  where `cfg["is_chief"]`);
* optionally ``train_step(model, data)``: one training step, as the body of
  Keras 3's `Model.train_step(self, data)` (forward, loss, gradients,
  `model.optimizer.apply`, metrics); returns the logs dict. It runs on every
  replica inside `fit`; the optimizer all-reduces the gradients;
* optionally ``predict(model, inputs, cfg)``: what `python -m tfdist.predict
  RUN_DIR INPUT...` prints for the trained model, one result per INPUT string
  (`tfdist.predict`);
* optionally ``distribution(cfg)``: a `keras.distribution` DataParallel,
  ModelParallel or LayoutMap, in place of `--strategy` and `--tensor-parallel`
  (`tfdist.keras_distribution.recipes`; docs/keras_distribution.md).

`recipes/TEMPLATE.py` is a copyable recipe with every member. Recipes import
Keras/TensorFlow inside these functions, so that loading one to validate
options does not start TensorFlow.

A recipe is named by path, or by name: `NAME.py` in the working directory
first, then the recipes shipped with tfdist (the repository's `recipes/`,
installed as `tfdist/recipes/`). Recipes know nothing of distribution.

Every failure to load a recipe, and every wrong thing a recipe function
returns, is a ConfigError starting ``recipe FILE:`` and naming the function.
"""

from __future__ import annotations

import importlib.util
import os
import traceback
from types import ModuleType

from tfdist.errors import ConfigError
from tfdist.option import Option

REQUIRED = ("DEFAULTS", "build_model", "build_dataset")
OPTIONAL_FUNCTIONS = ("check_config", "compile_kwargs", "build_optimizer", "callbacks",
                      "train_step", "predict", "distribution")


def _shipped_dir(package: str) -> str:
    """Where the recipes shipped with the package in `package` are."""
    installed = os.path.join(package, "recipes")  # a wheel maps recipes/ to tfdist/recipes
    # A checkout (`pip install -e .`, or PYTHONPATH as the benchmark runners and
    # the Horovod venv use) has them beside the package.
    checkout = os.path.join(os.path.dirname(package), "recipes")
    return installed if os.path.isdir(installed) else checkout


RECIPES_DIR = _shipped_dir(os.path.dirname(os.path.abspath(__file__)))


def available() -> list[str]:
    """Names of the recipes shipped with tfdist (`RECIPES_DIR`)."""
    if not os.path.isdir(RECIPES_DIR):
        return []
    return sorted(f[:-3] for f in os.listdir(RECIPES_DIR)
                  if f.endswith(".py") and not f.startswith("_"))


def resolve_path(name_or_path: str, cwd: str | None = None) -> str:
    """The file of a recipe given by path, or by name: `./NAME.py`, else a shipped one.

    A name is looked up in the working directory first, so that a user's own
    recipe runs by name wherever tfdist is installed (and may shadow a shipped
    one of the same name).

    Args:
        name_or_path: A recipe name (`digits_mlp`) or a path to a .py file.
        cwd: The directory looked in first; the working directory when None.

    Returns:
        The recipe file's absolute path.

    Raises:
        ConfigError: naming what was received, the places looked in and the
            shipped recipes.
    """
    looks_like_path = (name_or_path.endswith(".py") or os.sep in name_or_path
                       or (os.altsep or os.sep) in name_or_path)
    if looks_like_path or os.path.isdir(name_or_path):
        if os.path.isdir(name_or_path):
            raise ConfigError(f"recipe {name_or_path}: is a directory; pass a recipe .py file "
                              f"or a name from {available()}.")
        if not os.path.exists(name_or_path):
            raise ConfigError(f"recipe {name_or_path}: no such file. Available recipes: "
                              f"{available()} (or pass a path to a recipe .py file).")
        if not name_or_path.endswith(".py"):
            raise ConfigError(f"recipe {name_or_path}: not a .py file; a recipe is a Python "
                              "module defining DEFAULTS, build_model and build_dataset.")
        if not os.path.isfile(name_or_path):
            raise ConfigError(f"recipe {name_or_path}: not a regular file.")
        return os.path.abspath(name_or_path)
    own = os.path.join(os.path.abspath(cwd or os.getcwd()), f"{name_or_path}.py")
    if os.path.isfile(own):
        return own
    path = os.path.join(RECIPES_DIR, f"{name_or_path}.py")
    if not os.path.isfile(path):
        raise ConfigError(f"recipe {name_or_path!r}: not found in the working directory (no "
                          f"{own}) nor among the recipes shipped with tfdist (in {RECIPES_DIR}): "
                          f"{available()}. Pass one of those names, or a path to a recipe .py "
                          "file.")
    return path


def _import_failure(path: str, error: BaseException) -> ConfigError:
    if isinstance(error, SyntaxError) and error.filename == path:
        return ConfigError(f"recipe {path}: syntax error at line {error.lineno}: {error.msg}.")
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == path]
    where = f" (line {frames[-1].lineno})" if frames else ""
    text = str(error).splitlines()[0][:300] if str(error) else ""
    return ConfigError(f"recipe {path}: importing it failed{where}: "
                       f"{type(error).__name__}: {text}".rstrip(": ") + ".")


def load(name_or_path: str) -> ModuleType:
    """Imports a recipe module and checks its interface.

    The module's DEFAULTS are left as plain values (declarations replaced by
    their defaults); `module.DECLARED` keeps them as written.

    Raises:
        ConfigError: `recipe FILE: ...` when the recipe is missing, does not
            import, or lacks a member or has one of the wrong type.
    """
    path = resolve_path(name_or_path)
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(f"tfdist_recipe_{name}", path)
    if spec is None or spec.loader is None:  # pragma: no cover - .py files always have one
        raise ConfigError(f"recipe {path}: Python cannot import it.")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # a recipe is user code: any failure is a bad input
        raise _import_failure(path, e) from None
    missing = [attr for attr in REQUIRED if not hasattr(module, attr)]
    if missing:
        raise ConfigError(f"recipe {path}: missing {missing}; a recipe defines "
                          f"{list(REQUIRED)}.")
    for attr in ("build_model", "build_dataset", *OPTIONAL_FUNCTIONS):
        if hasattr(module, attr) and not callable(getattr(module, attr)):
            raise ConfigError(f"recipe {path}: {attr} must be a function. Received: "
                              f"{type(getattr(module, attr)).__name__}.")
    if not isinstance(module.DEFAULTS, dict):
        raise ConfigError(f"recipe {path}: DEFAULTS must be a dict of option values. "
                          f"Received: {type(module.DEFAULTS).__name__}.")
    module.DECLARED = dict(module.DEFAULTS)
    module.DEFAULTS = {k: v.default if isinstance(v, Option) else v
                       for k, v in module.DEFAULTS.items()}
    module.RECIPE_NAME = name
    module.RECIPE_FILE = path
    return module


def _where(recipe) -> str:
    return f"recipe {getattr(recipe, 'RECIPE_FILE', getattr(recipe, 'RECIPE_NAME', '?'))}"


def check_config(recipe: ModuleType, cfg: dict) -> None:
    """The recipe's `check_config(cfg)`, if it has one (before TensorFlow).

    Raises:
        ConfigError: the recipe's own, or its ValueError as one, naming the recipe.
    """
    if not hasattr(recipe, "check_config"):
        return
    try:
        recipe.check_config(cfg)
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(f"{_where(recipe)}: {e}") from None


def check_loss(recipe: ModuleType) -> None:
    """Refuses, before TensorFlow, a recipe that gives training no loss.

    Training needs `compile_kwargs(cfg)` (its `loss`) or a `train_step` of the
    recipe's own; without either, Keras's fit fails at its first step ("No loss
    to compute"), or trains a regularizer's penalty alone and exits 0.

    Raises:
        ConfigError: naming compile_kwargs and what to define.
    """
    if not hasattr(recipe, "compile_kwargs") and not hasattr(recipe, "train_step"):
        raise ConfigError(f"{_where(recipe)}: defines no compile_kwargs(cfg), so training "
                          "has no loss. Define compile_kwargs(cfg) returning "
                          "dict(loss=..., metrics=[...]) (see recipes/TEMPLATE.py), or "
                          "train_step(model, data).")


def compile_kwargs(recipe: ModuleType, cfg: dict) -> dict:
    """The recipe's loss and metrics for `model.compile` ({} when it defines none).

    Raises:
        ConfigError: when compile_kwargs returns something other than a dict, a
            dict without a loss (and the recipe has no train_step of its own:
            `check_loss`), or a dict with an optimizer (tfdist builds and wraps
            the optimizer).
    """
    if not hasattr(recipe, "compile_kwargs"):
        return {}
    kwargs = recipe.compile_kwargs(cfg)
    if not isinstance(kwargs, dict):
        raise ConfigError(f"{_where(recipe)}: compile_kwargs(cfg) must return a dict of "
                          f"model.compile arguments. Received: {type(kwargs).__name__}.")
    if "loss" not in kwargs and not hasattr(recipe, "train_step"):
        # loss=None, said explicitly, is a model that adds its own losses (add_loss).
        raise ConfigError(f"{_where(recipe)}: compile_kwargs(cfg) returned no 'loss', so "
                          f"training has none. Received: keys {sorted(kwargs)}. Add "
                          "loss=... (loss=None for a model whose own add_loss is its loss).")
    if "optimizer" in kwargs:
        raise ConfigError(f"{_where(recipe)}: compile_kwargs(cfg) returned an 'optimizer'; "
                          "tfdist compiles with the optimizer (it wraps it for the strategy). "
                          "Remove it; use --optimizer, --learning-rate, --momentum, or define "
                          "build_optimizer(cfg, learning_rate).")
    return kwargs


def build_optimizer(recipe: ModuleType, cfg: dict, learning_rate: float, options):
    """The recipe's optimizer, or tfdist's from `options` (the run's
    `tfdist.settings.Optimization`) when it defines none."""
    if hasattr(recipe, "build_optimizer"):
        return recipe.build_optimizer(cfg, learning_rate)
    from tfdist import optim

    return optim.build_optimizer(options, learning_rate)


def callbacks(recipe: ModuleType, cfg: dict, writer) -> list:
    """The recipe's extra `fit` callbacks ([] when it defines none).

    The recipe sees `cfg["is_chief"]` (to print once) and `cfg["writer"]`, the
    run's `writer.ChiefWriter` (to write files: chief only, atomically).
    """
    if not hasattr(recipe, "callbacks"):
        return []
    return list(recipe.callbacks({**cfg, "is_chief": writer.is_chief, "writer": writer}))


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


def build_model(recipe: ModuleType, cfg: dict):
    """`recipe.build_model(cfg)`, checked to be an uncompiled Keras model.

    Raises:
        ConfigError: naming the recipe function and what it returned.
    """
    import keras

    model = recipe.build_model(cfg)
    if not isinstance(model, keras.Model):
        raise ConfigError(f"{_where(recipe)}: build_model(cfg) must return a keras.Model. "
                          f"Received: {type(model).__name__}.")
    if hasattr(recipe, "distribution"):  # its LayoutMap asks for what tfdist splits
        from tfdist.keras_distribution import recipes

        recipes.check_model(recipe, cfg, model)
    return model


def build_dataset(recipe: ModuleType, cfg: dict, split: str):
    """`recipe.build_dataset(cfg, split)`, checked to be unbatched (x, y) examples.

    Returns:
        What the recipe returned: a `tf.data.Dataset` or a `tfdist.data.Source`.

    Raises:
        ConfigError: naming the recipe function when it returns something else
            (numpy arrays, a list, a batched dataset).
    """
    import tensorflow as tf

    from tfdist import data

    source = recipe.build_dataset(cfg, split)
    call = f"{_where(recipe)}: build_dataset(cfg, {split!r})"
    dataset = source.dataset if isinstance(source, data.Source) else source
    if not isinstance(dataset, tf.data.Dataset):
        raise ConfigError(f"{call} must return a tf.data.Dataset (or tfdist.data.Source) of "
                          f"unbatched (x, y) examples. Received: {type(source).__name__}. "
                          "For arrays, return tf.data.Dataset.from_tensor_slices((x, y)).")
    spec = dataset.element_spec
    if not isinstance(spec, tuple) or len(spec) not in (2, 3):
        raise ConfigError(f"{call} must yield (x, y) or (x, y, sample_weight) tuples. "
                          f"Received elements of spec {_short(spec)}.")
    return source


def check_fits(recipe: ModuleType, model, element_spec, batched: bool = False) -> None:
    """Checks that the dataset's x fits the model's single input (catches batched datasets).

    Args:
        recipe: The recipe (named in the message).
        model: Its model.
        element_spec: The spec of its dataset's elements.
        batched: True when `element_spec` is of tfdist's batches of the dataset.

    Raises:
        ConfigError: when x has one more dimension than an example should, or
            otherwise a shape the model cannot take.
    """
    import tensorflow as tf

    x = element_spec[0]
    inputs = getattr(model, "inputs", None) or []
    if len(inputs) != 1 or not isinstance(x, tf.TensorSpec) or x.shape.rank is None:
        return  # several inputs or unknown ranks: Keras itself will say
    want = tuple(inputs[0].shape[1:])
    got = tuple(x.shape)[1:] if batched else tuple(x.shape)
    if len(got) == len(want) + 1 and _compatible(got[1:], want):
        raise ConfigError(
            f"{_where(recipe)}: build_dataset(cfg, split) yields x of shape {got}, but "
            f"build_model(cfg) takes examples of shape {want}: the dataset looks already "
            "batched. Return unbatched examples (tfdist batches them at --global-batch-size).")
    if not _compatible(got, want):
        raise ConfigError(f"{_where(recipe)}: build_dataset(cfg, split) yields x of shape "
                          f"{got}, but build_model(cfg) takes examples of shape {want}.")


def _compatible(a, b) -> bool:
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))


def _short(spec) -> str:
    text = repr(spec)
    return text if len(text) < 200 else text[:200] + "..."


__all__ = ["available", "build_dataset", "build_model", "build_optimizer", "callbacks",
           "check_fits", "check_hooks_for_own_loop", "compile_kwargs", "install_train_step",
           "load", "resolve_path"]
