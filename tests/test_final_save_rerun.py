"""#48: a run whose final save fails keeps its state, and its rerun writes the model.

The "finished" mark is the run's metrics.json (written after the final model):
a backup at the last epoch's end alone is not, so the rerun resumes, trains no
step, and writes the model, instead of "already finished". In this process
(digits_mlp, 3 steps); the final save is made to fail with the error a full
disk gives.
"""

from __future__ import annotations

import json
import os

import pytest

from tfdist import config
from tfdist import recipe as recipe_lib
from tfdist.cluster import detect
from tfdist.errors import StorageError
from tfdist.run import loop, run_dir, trainer


def _cfg(model_dir, *more):
    recipe = recipe_lib.load("digits_mlp")
    return recipe, config.merge(recipe.DEFAULTS, [
        "--strategy", "single", "--epochs", "1", "--steps-per-epoch", "3", "--verbose", "0",
        "--model-dir", model_dir, *more], "recipe digits_mlp")


def test_a_failed_final_save_is_written_by_the_rerun(tmp_path, monkeypatch, capsys):
    model_dir = str(tmp_path / "m")
    recipe, cfg = _cfg(model_dir, "--final-weights", "sharded")

    def full_disk(*args, **kwargs):
        raise StorageError(f"{model_dir}/model.json: No space left on device (errno 28)")

    monkeypatch.setattr(loop, "save_final", full_disk)
    with pytest.raises(StorageError):
        trainer.train(recipe, cfg, detect({}))
    assert not os.path.exists(os.path.join(model_dir, "metrics.json"))
    found = run_dir.inspect(model_dir, cfg, recipe.RECIPE_NAME)
    assert found.unsaved_end and not found.finished and found.epochs_done == 1
    monkeypatch.undo()
    capsys.readouterr()

    result = trainer.train(recipe, cfg, detect({}))
    out = capsys.readouterr().out
    assert "already finished" not in out, out
    assert "final model was not written; resuming to evaluate it and write the model" in out
    assert result.metrics["global_step"] == 3  # no step trained again
    assert {"model.json", "model.weights.json"} <= set(os.listdir(model_dir))
    with open(os.path.join(model_dir, "metrics.json"), encoding="utf-8") as f:
        assert json.load(f)["global_step"] == 3
    assert run_dir.inspect(model_dir, cfg, recipe.RECIPE_NAME).finished

    # Now finished: the same command has nothing to do, and writes nothing.
    before = sorted(os.listdir(model_dir))
    assert trainer.train(recipe, cfg, detect({})).model is None
    assert "already finished (1 epochs), nothing to do" in capsys.readouterr().out
    assert sorted(os.listdir(model_dir)) == before
