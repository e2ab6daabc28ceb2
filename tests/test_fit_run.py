"""The run object itself, in this process: `FitRun`'s steps and what each leaves behind.

A single-replica run of digits_mlp at 3 steps an epoch: `set_up` builds the
`Distributed` an own script's `tfdist.setup()` would, `build` the model and
optimizer, `resume` finds nothing the first time and the backup the second,
`fit` trains to the asked epoch and `finish` writes the chief's files.
"""

from __future__ import annotations

import json
import os

import numpy as np

from tfdist import config
from tfdist import recipe as recipe_lib
from tfdist.writer import ChiefWriter
from tfdist.cluster import detect
from tfdist.run import loop, run_dir, trainer
from tfdist.settings import Settings


def _run(model_dir: str, epochs: int) -> trainer.FitRun:
    recipe = recipe_lib.load("digits_mlp")
    cfg = config.merge(recipe.DEFAULTS, ["--strategy", "single", "--epochs", str(epochs),
                                         "--steps-per-epoch", "3", "--verbose", "0",
                                         "--model-dir", model_dir], "recipe digits_mlp")
    found = run_dir.inspect(model_dir, cfg, recipe.RECIPE_NAME)  # as trainer.train does
    run = loop.Run(recipe, cfg, detect({}), ChiefWriter(model_dir, True), None, [], found,
                   Settings.of(cfg))
    return trainer.FitRun(run)


def test_fit_run_steps_then_a_second_run_resumes_from_the_first(tmp_path):
    model_dir = str(tmp_path / "m")
    first = _run(model_dir, epochs=1)
    with first.writer.claim(lambda m: None):
        first.set_up()
        assert first.dist.name == "single" and first.dist.num_replicas == 1
        assert first.lr == first.settings.optimization.learning_rate  # no scaling asked
        first.build()
        assert first.steps_per_epoch == 3 and first.model.built
        assert len(first.optimizer.variables) > 1  # built, so a backup can fill its slots
        first.resume()
        assert first.state.global_step == 0 and first.resumed_from is None
        before = [w.copy() for w in first.model.get_weights()]
        first.fit()
        assert (first.state.epoch, first.state.global_step) == (1, 3)
        assert not all(np.array_equal(a, b) for a, b in zip(before, first.model.get_weights()))
        result = first.finish()
    assert result.metrics["global_step"] == 3 and result.metrics["strategy"] == "single"
    assert json.load(open(os.path.join(model_dir, "metrics.json")))["global_step"] == 3
    assert os.path.exists(os.path.join(model_dir, "model.keras"))
    # `python -m tfdist.predict RUN_DIR 0 5`, the main job's use: the digit of held-out
    # images 0 and 5, as the trained model's argmax.
    from tfdist import predict
    x, y = recipe_lib.load("digits_mlp").load_arrays()[1]
    expected = np.argmax(first.model.predict(x[[0, 5]], verbose=0), axis=1)
    assert predict.predict(model_dir, ["0", "5"]) == [
        f"{expected[0]} (held-out example 0, labelled {y[0]})",
        f"{expected[1]} (held-out example 5, labelled {y[5]})"]

    second = _run(model_dir, epochs=2)
    with second.writer.claim(lambda m: None):
        second.set_up()
        second.build()
        second.resume()  # the first run's last backup: its weights, its position
        assert second.resumed_from and (second.state.epoch, second.state.global_step) == (1, 3)
        for a, b in zip(first.model.get_weights(), second.model.get_weights()):
            np.testing.assert_array_equal(a, b)
        second.fit()
        assert second.state.global_step == 6
