"""A subclassed Keras model (variables made at its first call) trains, saves and exports.

#48: such a recipe stopped at fit's first step ("Unknown variable ... This optimizer
can only be called for the variables it was originally built with": the trainer built
the optimizer for a model that had no variables yet), and `tfdist.export` found 0 of
its backup's variables in the valueless model it builds. In process, one replica.
"""

from __future__ import annotations

import os

import numpy as np

from tfdist import config
from tfdist import recipe as recipe_lib
from tfdist.cluster import detect
from tfdist.run import loop, run_dir, trainer
from tfdist.settings import Settings
from tfdist.writer import ChiefWriter
from tests.conftest import REPO

SUBCLASSED = '''
import sys
sys.path.insert(0, {recipes!r})
import keras
from digits_mlp import DEFAULTS, build_dataset, compile_kwargs


@keras.saving.register_keras_serializable(package="tfdist_test_subclassed")
class Two(keras.Model):
    def __init__(self, units=16, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.hidden = keras.layers.Dense(units, activation="relu")
        self.out = keras.layers.Dense(10)

    def call(self, x):
        return self.out(self.hidden(x))

    def get_config(self):
        return {{**super().get_config(), "units": self.units}}


def build_model(cfg):
    return Two(name="two")
'''


def test_a_subclassed_model_trains_saves_and_exports(tmp_path):
    path = tmp_path / "subclassed.py"
    path.write_text(SUBCLASSED.format(recipes=os.path.join(REPO, "recipes")))
    model_dir = str(tmp_path / "run")
    recipe = recipe_lib.load(str(path))
    cfg = config.merge(recipe.DEFAULTS, ["--strategy", "single", "--epochs", "1",
                                         "--steps-per-epoch", "3", "--verbose", "0",
                                         "--model-dir", model_dir], "recipe subclassed")
    found = run_dir.inspect(model_dir, cfg, recipe.RECIPE_NAME)
    run = trainer.FitRun(loop.Run(recipe, cfg, detect({}), ChiefWriter(model_dir, True), None,
                                  [], found, Settings.of(cfg)))
    with run.writer.claim(lambda m: None):
        run.set_up()
        run.build()
        assert len(run.model.weights) == 4  # made before the optimizer was built
        before = [w.copy() for w in run.model.get_weights()]
        run.resume()
        run.fit()
        assert run.state.global_step == 3
        assert not any(np.array_equal(a, b) for a, b in zip(before, run.model.get_weights()))
        run.finish()

    import keras

    from tfdist import checkpoint, export

    saved = keras.saving.load_model(os.path.join(model_dir, "model.keras"), compile=False)
    backup = checkpoint.backup_paths(os.path.join(model_dir, "backup"))[-1]
    out = str(tmp_path / "export")
    assert export.export([backup], out, "keras", recipe, cfg, log=lambda m: None) == [
        "model.keras"]
    exported = keras.saving.load_model(os.path.join(out, "model.keras"), compile=False)
    assert type(exported).__name__ == "Two"
    for a, b in zip(saved.get_weights(), exported.get_weights()):
        np.testing.assert_array_equal(a, b)
