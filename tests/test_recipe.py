"""Recipe lookup by name and path."""

import os

import pytest

from tests.conftest import REPO
from tfdist import recipe
from tfdist.errors import ConfigError


def test_shipped_recipes_load():
    assert "digits_mlp" in recipe.available()
    module = recipe.load("digits_mlp")
    assert module.RECIPE_NAME == "digits_mlp" and "hidden_units" in module.DEFAULTS


def test_load_by_path():
    assert recipe.load(recipe.resolve_path("digits_mlp")).RECIPE_NAME == "digits_mlp"


def test_unknown_recipe_lists_both_places_and_the_shipped_recipes(tmp_path):
    with pytest.raises(ConfigError) as e:
        recipe.resolve_path("digitz", cwd=str(tmp_path))
    assert str(e.value).startswith(
        f"recipe 'digitz': not found in the working directory (no {tmp_path / 'digitz.py'}) "
        f"nor among the recipes shipped with tfdist (in {recipe.RECIPES_DIR}): ["), str(e.value)
    assert "'digits_mlp'" in str(e.value) and "a path to a recipe .py file" in str(e.value)
    with pytest.raises(ConfigError, match=r"recipe 'digitz': not found in the working directory"):
        recipe.load("digitz")
    with pytest.raises(ConfigError, match=r"recipe nope/x\.py: no such file"):
        recipe.load("nope/x.py")


def test_a_name_is_looked_up_in_the_working_directory_first(tmp_path, monkeypatch):
    own = tmp_path / "my_model.py"
    own.write_text(GOOD.replace("def build_model", "DEFAULTS = {'epochs': 3}\ndef build_model"))
    assert recipe.resolve_path("my_model", cwd=str(tmp_path)) == str(own)
    # A user's file shadows a shipped recipe of the same name.
    (tmp_path / "digits_mlp.py").write_text("DEFAULTS = {}\n" + GOOD)
    assert recipe.resolve_path("digits_mlp", cwd=str(tmp_path)) == str(tmp_path / "digits_mlp.py")
    assert recipe.resolve_path("wide_mlp", cwd=str(tmp_path)) == os.path.join(
        recipe.RECIPES_DIR, "wide_mlp.py")
    monkeypatch.chdir(tmp_path)
    module = recipe.load("my_model")
    assert module.RECIPE_FILE == str(own) and module.DEFAULTS == {"epochs": 3}


def test_shipped_recipes_are_found_installed_or_in_a_checkout(tmp_path):
    # Installed from a wheel: site-packages/tfdist/recipes, whatever lies beside tfdist.
    site = tmp_path / "site-packages"
    (site / "tfdist" / "recipes").mkdir(parents=True)
    (site / "recipes").mkdir()
    assert recipe._shipped_dir(str(site / "tfdist")) == str(site / "tfdist" / "recipes")
    # A checkout (pip install -e ., PYTHONPATH): the repository's recipes/.
    checkout = tmp_path / "checkout"
    (checkout / "tfdist").mkdir(parents=True)
    assert recipe._shipped_dir(str(checkout / "tfdist")) == str(checkout / "recipes")
    assert recipe.RECIPES_DIR == os.path.join(REPO, "recipes")  # this checkout


def test_recipe_missing_members(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text("DEFAULTS = {}\n")
    with pytest.raises(ConfigError, match=r"recipe .*bad\.py: missing \['build_model', "
                                          r"'build_dataset'\]"):
        recipe.load(str(path))


def test_fit_only_hooks_are_refused_for_parameter_server():
    recipe_lib = recipe
    template = recipe_lib.load("TEMPLATE")
    with pytest.raises(ConfigError, match=r"defines \['callbacks', 'train_step'\].*"
                                          "parameter_server has its own training loop"):
        recipe_lib.check_hooks_for_own_loop(template, "parameter_server")
    recipe_lib.check_hooks_for_own_loop(recipe_lib.load("digits_mlp"), "parameter_server")


GOOD = "def build_model(cfg): pass\ndef build_dataset(cfg, split): pass\n"


def test_a_recipe_without_a_loss_is_refused_naming_compile_kwargs(tmp_path):
    path = tmp_path / "no_loss.py"
    path.write_text("DEFAULTS = {}\n" + GOOD)
    no_loss = recipe.load(str(path))
    with pytest.raises(ConfigError) as e:
        recipe.check_loss(no_loss)
    assert str(e.value) == (f"recipe {path}: defines no compile_kwargs(cfg), so training has "
                            "no loss. Define compile_kwargs(cfg) returning dict(loss=..., "
                            "metrics=[...]) (see recipes/TEMPLATE.py), or train_step(model, "
                            "data).")
    no_loss.train_step = lambda model, data: {}  # computes its own loss
    recipe.check_loss(no_loss)
    # compile_kwargs that return no loss: refused too; loss=None said explicitly is a
    # model whose add_loss is its loss.
    no_loss = recipe.load(str(path))
    no_loss.compile_kwargs = lambda cfg: {"metrics": ["accuracy"]}
    recipe.check_loss(no_loss)
    with pytest.raises(ConfigError, match=r"compile_kwargs\(cfg\) returned no 'loss', so "
                                          r"training has none\. Received: keys \['metrics'\]"):
        recipe.compile_kwargs(no_loss, {})
    no_loss.compile_kwargs = lambda cfg: {"loss": None}
    assert recipe.compile_kwargs(no_loss, {}) == {"loss": None}


def test_a_recipes_check_config_runs_as_a_config_error(tmp_path):
    digits = recipe.load("digits_mlp")
    recipe.check_config(digits, {**digits.DEFAULTS, "data_dir": ""})  # scikit-learn's copy
    with pytest.raises(ConfigError, match=r"data_dir='/no/such/dir' is not a directory"):
        recipe.check_config(digits, {**digits.DEFAULTS, "data_dir": "/no/such/dir"})
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"has no 'train-\*\.tfrecord' files"):
        recipe.check_config(digits, {**digits.DEFAULTS, "data_dir": str(empty)})
    template = recipe.load("TEMPLATE")
    with pytest.raises(ConfigError, match="TEMPLATE: num_classes must be at least 2"):
        recipe.check_config(template, {**template.DEFAULTS, "num_classes": 1})
    path = tmp_path / "plain.py"
    path.write_text("DEFAULTS = {}\n" + GOOD + "def check_config(cfg):\n"
                    "    raise ValueError('size must be even')\n")
    with pytest.raises(ConfigError, match=rf"recipe {path}: size must be even"):
        recipe.check_config(recipe.load(str(path)), {})


@pytest.mark.parametrize("source, message", [
    ("DEFAULTS = {\n  'a': 1,,\n}\n" + GOOD, r"recipe {f}: syntax error at line 2: invalid syntax\."),
    ("import no_such_module_xyz\nDEFAULTS = {}\n" + GOOD,
     r"recipe {f}: importing it failed \(line 1\): ModuleNotFoundError: No module named "
     r"'no_such_module_xyz'\."),
    ("DEFAULTS = {}\nraise SystemExit(3)\n" + GOOD, r"recipe {f}: importing it failed \(line 2\): "
                                                    r"SystemExit: 3\."),
    ("DEFAULTS = [('epochs', 2)]\n" + GOOD, r"recipe {f}: DEFAULTS must be a dict of option "
                                            r"values\. Received: list\."),
    ("DEFAULTS = {}\nbuild_model = 3\ndef build_dataset(cfg, split): pass\n",
     r"recipe {f}: build_model must be a function\. Received: int\."),
    ("DEFAULTS = {'epochs': '2'}\n" + GOOD, None),  # checked when merged, see below
])
def test_every_load_failure_is_one_config_error(tmp_path, source, message):
    path = tmp_path / "r.py"
    path.write_text(source)
    if message is None:
        from tfdist import config

        module = recipe.load(str(path))
        with pytest.raises(ConfigError, match=r"recipe r sets DEFAULTS: --epochs must be an "
                                              r"integer, not str"):
            config.merge(module.DECLARED, [], "recipe r")
        return
    with pytest.raises(ConfigError) as e:
        recipe.load(str(path))
    import re

    assert re.fullmatch(message.format(f=re.escape(str(path))), str(e.value)), str(e.value)


def test_paths_that_are_not_recipe_files(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match=r"recipe .*notes\.txt: not a \.py file"):
        recipe.load(str(tmp_path / "notes.txt"))
    with pytest.raises(ConfigError, match=r"recipe .*: is a directory; pass a recipe \.py file"):
        recipe.load(str(tmp_path))
    (tmp_path / "d.py").mkdir()
    with pytest.raises(ConfigError, match=r"recipe .*d\.py: is a directory"):
        recipe.load(str(tmp_path / "d.py"))


def test_declared_recipe_defaults_are_plain_values_after_load():
    module = recipe.load("digits_mlp")
    assert module.DEFAULTS["hidden_units"] == 64
    assert module.DECLARED["hidden_units"].ge == 1


# What a recipe returns is checked once TensorFlow runs, naming the recipe function
# (with --steps-per-epoch the test split is the first one built).
BAD_RETURNS = {
    "batched": ("ds = base.build_dataset(cfg, split).batch(8)",
                "build_dataset(cfg, split) yields x of shape (None, 64), but build_model(cfg) "
                "takes examples of shape (64,): the dataset looks already batched."),
    "arrays": ("ds = base.load_arrays()[0 if split == 'train' else 1]",
               "build_dataset(cfg, 'test') must return a tf.data.Dataset (or "
               "tfdist.data.Source) of unbatched (x, y) examples. Received: tuple."),
    "x_only": ("ds = base.build_dataset(cfg, split).map(lambda x, y: x)",
               "build_dataset(cfg, 'test') must yield (x, y) or (x, y, sample_weight) tuples."),
}
RECIPE_TEMPLATE = """
import os, sys
sys.path.insert(0, {recipes!r})
import digits_mlp as base
DEFAULTS = dict(base.DEFAULTS)
build_model = {build_model}
def compile_kwargs(cfg):
    return {compile_kwargs}
def build_dataset(cfg, split):
    {dataset}
    return ds
"""


@pytest.mark.integration
def test_bad_recipe_returns_are_named_errors(tmp_path):
    from tests.conftest import run_py

    cases = []
    for name, (dataset, message) in BAD_RETURNS.items():
        cases.append((name, dict(dataset=dataset), message))
    cases.append(("optimizer", dict(compile_kwargs="dict(base.compile_kwargs(cfg), "
                                                   "optimizer='adam')"),
                  "compile_kwargs(cfg) returned an 'optimizer'; tfdist compiles with the optimizer"))
    cases.append(("no_loss", dict(compile_kwargs="dict(metrics=['accuracy'])"),
                  "compile_kwargs(cfg) returned no 'loss', so training has none. Received: "
                  "keys ['metrics']."))
    cases.append(("not_model", dict(build_model="lambda cfg: 'a model'"),
                  "build_model(cfg) must return a keras.Model. Received: str."))
    paths = []
    for name, parts, _ in cases:
        parts = {"dataset": "ds = base.build_dataset(cfg, split)",
                 "build_model": "base.build_model", "compile_kwargs": "base.compile_kwargs(cfg)",
                 **parts}
        path = tmp_path / f"{name}.py"
        path.write_text(RECIPE_TEMPLATE.format(recipes=recipe.RECIPES_DIR, **parts))
        paths.append(str(path))
    probe = ("import sys; from tfdist.train import main\n"
             "for p in sys.argv[1:]:\n"
             "    print('RC', main([p, '--epochs', '1', '--steps-per-epoch', '1', '--verbose', "
             "'0', '--model-dir', p + '.out']), flush=True)\n"
             "    print('END', file=sys.stderr, flush=True)\n")
    proc = run_py(["-c", probe, *paths], timeout=300)
    codes = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("RC")]
    errors = proc.stderr.split("END\n")
    assert len(codes) == len(cases), proc.stderr[-3000:]
    for (name, _, message), path, code, err in zip(cases, paths, codes, errors):
        assert code == "2", (name, err[-2000:])
        assert f"error: recipe {path}: " in err and message in err, (name, err[-2000:])
        assert "Traceback" not in err, (name, err[-2000:])
        assert not os.path.exists(path + ".out"), name  # no backup/, no lock left behind
