"""`python -m tfdist.predict`: what it reads from a run dir, and every refusal before
TensorFlow (in process; the real command on a trained run is in test_numbers_to_words)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tfdist import predict


def _run_dir(tmp_path, metrics=None, model=True):
    run = tmp_path / "run"
    run.mkdir()
    if model:
        (run / "model.keras").write_bytes(b"not read before the recipe is checked")
    if metrics is not None:
        (run / "metrics.json").write_text(json.dumps(metrics))
    return str(run)


def _error(capsys, argv):
    assert predict.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err  # one line
    return err


def test_a_missing_run_dir_is_one_line_and_exit_2(tmp_path, capsys):
    err = _error(capsys, [str(tmp_path / "nowhere"), "305"])
    assert f"run dir {tmp_path / 'nowhere'}: no such directory" in err and "model_dir=" in err


def test_a_run_without_model_keras_is_one_line_and_exit_2(tmp_path, capsys):
    run = _run_dir(tmp_path, metrics={"recipe": "numbers_to_words"}, model=False)
    err = _error(capsys, [run, "305"])
    assert "has no model.keras; a run writes it when it finishes" in err


def test_a_recipe_without_predict_is_one_line_and_exit_2(tmp_path, capsys):
    own = tmp_path / "no_predict.py"
    own.write_text("DEFAULTS = {}\ndef build_model(cfg): pass\ndef build_dataset(cfg, split): pass\n")
    run = _run_dir(tmp_path, metrics={"recipe": "no_predict", "recipe_file": str(own),
                                      "config": {}})
    err = _error(capsys, [run, "1"])
    assert "no_predict.py: has no predict(model, inputs, cfg)" in err
    assert "recipes/TEMPLATE.py" in err


def test_every_shipped_recipe_has_predict():
    from tfdist import recipe as recipe_lib

    missing = [n for n in recipe_lib.available() if not callable(
        getattr(recipe_lib.load(n), "predict", None))]
    assert not missing, f"shipped recipes without predict(): {missing}"


class _Argmax:
    """A stand-in classifier: the class is the index of the largest value."""

    def predict(self, x, verbose=0):
        return x.reshape(len(x), -1)


def test_classify_reads_a_held_out_index_or_one_example():
    x = np.eye(3, dtype="float32")[[2, 0, 1]].reshape(3, 3)
    y = np.array([2, 0, 1])
    assert predict.classify(_Argmax(), ["0", "2", "0,5,1"], (x, y), "toy") == [
        "2 (held-out example 0, labelled 2)", "1 (held-out example 2, labelled 1)", "1"]


@pytest.mark.parametrize("text", ["3", "x", "1,2", "1,2,3,4", "-1"])
def test_classify_refuses_other_inputs_saying_how_to_pass_one(text):
    x, y = np.zeros((3, 3), "float32"), np.zeros(3)
    with pytest.raises(predict.ConfigError) as e:
        predict.classify(_Argmax(), [text], (x, y), "toy")
    assert str(e.value) == (f"toy: an input is the index of a held-out example (0 to 2) or one "
                            f"example as 3 comma-separated numbers. Received: {text!r}.")


def test_help_exits_0(capsys):
    with pytest.raises(SystemExit) as e:
        predict.main(["--help"])
    assert e.value.code == 0
    assert "RUN_DIR INPUT" in capsys.readouterr().out


def test_the_record_comes_from_metrics_json_else_the_newest_backup(tmp_path):
    run = _run_dir(tmp_path, metrics={"recipe": "numbers_to_words", "recipe_file": "/gone.py",
                                      "config": {"max_digits": 3}})
    assert predict.run_record(run) == {"recipe": "numbers_to_words", "recipe_file": "/gone.py",
                                       "config": {"max_digits": 3}}
    # A run from before metrics.json carried its configuration: the backup's record has it.
    os.remove(os.path.join(run, "metrics.json"))
    backup = os.path.join(run, "backup")
    os.makedirs(backup)
    for step, digits in ((10, 2), (20, 4)):
        meta = json.dumps({"recipe": "numbers_to_words", "config": {"max_digits": digits}})
        np.savez(os.path.join(backup, f"ckpt-{step:010d}.npz"), w=np.zeros(2),
                 meta=np.frombuffer(meta.encode(), np.uint8))
    assert predict.run_record(run)["config"] == {"max_digits": 4}  # the newest
    # The recipe recorded by file is gone: found by name among the shipped ones.
    recipe = predict.load_recipe({"recipe": "numbers_to_words", "recipe_file": "/gone.py"})
    assert recipe.RECIPE_NAME == "numbers_to_words" and callable(recipe.predict)


def test_a_run_dir_naming_no_recipe_asks_for_one(tmp_path, capsys):
    run = _run_dir(tmp_path, metrics={"test": {}})
    err = _error(capsys, [run, "1"])
    assert "neither metrics.json nor a backup says which recipe" in err and "--recipe" in err


def test_the_template_documents_predict_with_a_working_one():
    from tfdist import recipe as recipe_lib
    from tfdist.errors import ConfigError

    template = recipe_lib.load("TEMPLATE")
    cfg = dict(template.DEFAULTS)
    model = template.build_model(cfg)
    row = ",".join(["0.5"] * cfg["num_features"])
    got = template.predict(model, [row, row], cfg)
    assert len(got) == 2 and got[0] == got[1] and 0 <= int(got[0]) < cfg["num_classes"]
    with pytest.raises(ConfigError, match=r"16 comma-separated numbers. Received: '1,2'"):
        template.predict(model, ["1,2"], cfg)
    assert "predict(model, inputs, cfg)" in open(template.RECIPE_FILE).read()
