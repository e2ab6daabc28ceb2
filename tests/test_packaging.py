"""The wheel built from the repository: it holds the package and the recipes, and runs."""

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.conftest import REPO, clean_env, tail


def _copy_checkout(src) -> None:
    """What a build reads, copied (a build writes build/ and *.egg-info beside its sources)."""
    src.mkdir()
    junk = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(REPO, name), src / name)
    for name in ("tfdist", "recipes"):
        shutil.copytree(os.path.join(REPO, name), src / name, ignore=junk)


def _venv(path) -> str:
    """A venv that sees this Python's packages (TensorFlow: no download); its python."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(path)], check=True, timeout=120)
    return str(path / "bin" / "python")


# Run from an empty directory by the venv's python: where tfdist and a shipped recipe come from.
IMPORT_RECIPE = ("import tfdist; from tfdist.recipes import numbers_to_words as r; "
                 "print(tfdist.__file__); print(r.__file__); print(r.digit_words(305))")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """A wheel built from a copy of this checkout."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    _copy_checkout(src)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps",
                           "--no-build-isolation", "--no-index", "-w", str(root / "dist")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, tail(proc)
    (path,) = (root / "dist").glob("tfdist-*.whl")
    return path


def _source_files(folder: str) -> set[str]:
    top = os.path.join(REPO, folder)
    return {os.path.relpath(os.path.join(d, f), top) for d, _, files in os.walk(top)
            if "__pycache__" not in d for f in files if f.endswith(".py")}


def test_wheel_holds_every_module_and_the_recipes(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    # Every module of the package: a subpackage left out of pyproject's list fails here.
    missing = sorted(f"tfdist/{f}" for f in _source_files("tfdist") if f"tfdist/{f}" not in names)
    assert not missing, f"modules missing from the wheel: {missing}"
    recipes = _source_files("recipes")
    assert {"digits_mlp.py", "TEMPLATE.py"} <= recipes
    missing = sorted(f"tfdist/recipes/{f}" for f in recipes if f"tfdist/recipes/{f}" not in names)
    assert not missing, f"recipes missing from the wheel: {missing}"
    assert not [n for n in names if n.startswith("recipes/")], "recipes/ must not be top-level"


@pytest.mark.integration
def test_wheel_in_a_fresh_venv_trains_from_an_empty_directory(wheel, tmp_path):
    # The venv sees this Python's TensorFlow (no download) but installs tfdist
    # from the wheel, which it finds before the checkout's editable install.
    venv = tmp_path / "venv"
    python = _venv(venv)
    env = clean_env()
    del env["PYTHONPATH"]  # clean_env points it at the checkout
    install = subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-index",
                              str(wheel)], capture_output=True, text=True, env=env, timeout=300)
    assert install.returncode == 0, tail(install)
    empty = tmp_path / "empty"
    empty.mkdir()
    where = subprocess.run([python, "-c", "import tfdist, tfdist.recipe as r; "
                                          "print(tfdist.__file__); print(r.RECIPES_DIR)"],
                           capture_output=True, text=True, env=env, cwd=empty, timeout=120)
    assert where.returncode == 0, tail(where)
    package, recipes = where.stdout.split()
    assert package.startswith(str(venv)) and recipes.startswith(str(venv)), where.stdout
    shipped = subprocess.run([python, "-c", IMPORT_RECIPE], capture_output=True, text=True,
                             env=env, cwd=empty, timeout=120)
    assert shipped.returncode == 0, tail(shipped)
    assert shipped.stdout.splitlines()[1:] == [
        str(venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
            / "site-packages" / "tfdist" / "recipes" / "numbers_to_words.py"),
        "three zero five"], shipped.stdout
    proc = subprocess.run([python, "-m", "tfdist.train", "--epochs", "1", "--verbose", "0"],
                          capture_output=True, text=True, env=env, cwd=empty, timeout=600)
    assert proc.returncode == 0, tail(proc)
    (model,) = empty.glob("runs/digits_mlp/*/model.keras")  # the run dir's name is not at issue
    assert (model.parent / "metrics.json").is_file(), tail(proc)


@pytest.mark.integration
def test_editable_install_imports_the_shipped_recipes_as_tfdist_recipes(tmp_path):
    # The README's `pip install -e ".[dev]"` (here without the extras, from a copy, into a
    # venv that sees this Python's packages): tfdist.recipes maps to recipes/ there too.
    src = tmp_path / "src"
    _copy_checkout(src)
    python = _venv(tmp_path / "venv")
    env = clean_env()
    del env["PYTHONPATH"]  # clean_env points it at the checkout
    install = subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-index",
                              "--no-build-isolation", "-e", str(src)],
                             capture_output=True, text=True, env=env, timeout=300)
    assert install.returncode == 0, tail(install)
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run([python, "-c", IMPORT_RECIPE], capture_output=True, text=True,
                          env=env, cwd=empty, timeout=120)
    assert proc.returncode == 0, tail(proc)
    assert proc.stdout.splitlines() == [str(src / "tfdist" / "__init__.py"),
                                        str(src / "recipes" / "numbers_to_words.py"),
                                        "three zero five"], proc.stdout
