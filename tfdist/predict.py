"""`python -m tfdist.predict RUN_DIR INPUT...`: use a trained model, one result per input.

    python -m tfdist.train                                        # the main job, digits_mlp
    python -m tfdist.predict runs/digits_mlp/single 0                # 6 (held-out example 0, labelled 6)
    python -m tfdist.train numbers_to_words
    python -m tfdist.predict runs/numbers_to_words/single 305 42     # three zero five / four two

RUN_DIR is the model dir a `tfdist.train` run wrote (its first line says
`model_dir=...`). Its model.keras is loaded without compiling and handed,
with the INPUT strings as typed and the run's configuration, to its recipe's
`predict(model, inputs, cfg)`, which returns one printable result per input;
each is printed on a line of its own. The recipe and its options are those
the run recorded (metrics.json, else its newest backup); `--recipe` names
another file or name for the same recipe (say, a copy moved elsewhere).

Everything that can be checked without TensorFlow is, first: a missing run
dir, one without model.keras (the run has not finished), a recipe without
`predict`. Each is one line and exit 2, as is an input the recipe refuses.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tfdist import exit_codes, recipe as recipe_lib
from tfdist.errors import CheckpointError, ConfigError
from tfdist.model_dir import BACKUP_DIR

MODEL = "model.keras"
SHARDED = "model.weights.json"  # with model.json: the form of a model larger than one process


def run_record(run_dir: str) -> dict:
    """What the run in `run_dir` recorded: {"recipe", "recipe_file", "config"}.

    From metrics.json (written with model.keras), else the newest backup's
    record (runs from before metrics.json carried the configuration).

    Raises:
        ConfigError: when neither names the recipe.
    """
    record: dict = {}
    path = os.path.join(run_dir, "metrics.json")
    if os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as f:
                record = json.load(f)
        except (OSError, ValueError):
            record = {}
    if "config" not in record:
        backup = _newest_backup_record(run_dir)
        record = {**backup, **{k: v for k, v in record.items() if v is not None}}
    if not record.get("recipe"):
        raise ConfigError(f"{run_dir}: neither metrics.json nor a backup says which recipe "
                          "trained it. Pass --recipe NAME_OR_FILE.")
    return {"recipe": record["recipe"], "recipe_file": record.get("recipe_file"),
            "config": record.get("config") or {}}


def _newest_backup_record(run_dir: str) -> dict:
    """The newest backup's record (its `meta` entry only, not its arrays); {} if none reads."""
    from tfdist.checkpoint import BackupStore, backup_paths

    for path in reversed(backup_paths(os.path.join(run_dir, BACKUP_DIR))):
        try:
            return BackupStore.read_record(path)
        except CheckpointError:  # a truncated or foreign file: try the one before
            continue
    return {}


def recipe_of(record: dict, override: str | None = None):
    """The run's recipe: `override`, else the file it recorded if still there, else its name.

    Raises:
        ConfigError: when it cannot be found.
    """
    recorded = record.get("recipe_file")
    if override:
        return recipe_lib.load(override)
    if recorded and os.path.isfile(recorded):
        return recipe_lib.load(recorded)
    return recipe_lib.load(record["recipe"])


def load_recipe(record: dict, override: str | None = None):
    """The run's recipe (`recipe_of`), which must have `predict`.

    Raises:
        ConfigError: when it cannot be found or has no `predict`.
    """
    recipe = recipe_of(record, override)
    if not hasattr(recipe, "predict"):
        raise ConfigError(
            f"recipe {recipe.RECIPE_FILE}: has no predict(model, inputs, cfg), so tfdist cannot "
            "tell what to do with the inputs. Define it (see recipes/TEMPLATE.py), or load "
            f"the model yourself: keras.saving.load_model(PATH, compile=False).")
    return recipe


def check_run_dir(run_dir: str) -> str:
    """The path of the run's model.keras.

    Raises:
        ConfigError: when the dir or its model.keras is missing.
    """
    if not os.path.isdir(run_dir):
        raise ConfigError(f"run dir {run_dir}: no such directory. Pass the model dir a "
                          "`python -m tfdist.train` run wrote (its first line says "
                          "model_dir=...; by default runs/RECIPE/...).")
    path = os.path.join(run_dir, MODEL)
    sharded = os.path.join(run_dir, SHARDED)
    if os.path.isfile(sharded):  # a model larger than one process (--final-weights)
        return sharded
    if not os.path.isfile(path):
        raise ConfigError(f"run dir {run_dir}: has no {MODEL}; a run writes it when it "
                          "finishes. Rerun its training command to finish it, or pass the "
                          "dir of a finished run.")
    return path


def load(path: str):
    """The model at `path`: model.keras, or model.json beside its sharded weights."""
    import keras

    if os.path.basename(path) != SHARDED:
        return keras.saving.load_model(path, compile=False)
    with open(os.path.join(os.path.dirname(path), "model.json"), encoding="utf-8") as f:
        model = keras.models.model_from_json(f.read())
    model.load_weights(path)
    return model


def predict(run_dir: str, inputs: list[str], recipe_override: str | None = None) -> list[str]:
    """The recipe's `predict` on the run's model: one printable line per input.

    Raises:
        ConfigError: for a missing run dir or model, a recipe without `predict`,
            an input the recipe refuses, or a result that is not one per input.
    """
    path = check_run_dir(run_dir)
    record = run_record(run_dir)
    recipe = load_recipe(record, recipe_override)
    cfg = {**recipe.DEFAULTS, **record["config"]}

    from tfdist.compat.tf_startup_logs import import_tensorflow

    import_tensorflow()
    try:
        model = load(path)
    except Exception as e:  # a file Keras cannot read: say which, in one line
        raise ConfigError(f"{path}: Keras cannot load it ({type(e).__name__}: "
                          f"{str(e).splitlines()[0][:300] if str(e) else ''}).") from None
    try:
        results = recipe.predict(model, list(inputs), cfg)
    except ConfigError:
        raise  # the recipe's own words
    except ValueError as e:  # a recipe's plain refusal of an input
        raise ConfigError(f"recipe {recipe.RECIPE_FILE}: predict refused the inputs: {e}") \
            from None
    results = list(results)
    if len(results) != len(inputs):
        raise ConfigError(f"recipe {recipe.RECIPE_FILE}: predict(model, inputs, cfg) must "
                          f"return one result per input. Received: {len(results)} for "
                          f"{len(inputs)} input(s).")
    return [str(r) for r in results]


def classify(model, inputs: list[str], held_out, name: str) -> list[str]:
    """A classifier recipe's `predict`: the class of each input, as a printable line.

    An input is either the index of a held-out (test split) example, printed with its
    label (`7 (held-out example 3, labelled 7)`), or the example itself as
    comma-separated numbers (as many as one example has values), printed as its class.

    Args:
        model: The run's model (logits or probabilities last).
        inputs: The INPUT strings as typed.
        held_out: (x, y) arrays of the recipe's test split.
        name: The recipe's name, for the refusal.

    Raises:
        ConfigError: for an input that is neither, saying how to pass one.
    """
    import numpy as np

    x, y = held_out
    size = int(np.prod(x.shape[1:]))
    rows, labels = [], []
    for text in inputs:
        text = str(text).strip()
        if text.isascii() and text.isdigit() and int(text) < len(x):
            rows.append(x[int(text)])
            labels.append((int(text), int(y[int(text)])))
            continue
        try:
            row = np.array([float(v) for v in text.split(",")], dtype=x.dtype)
        except ValueError:
            row = np.zeros(0)
        if row.size != size or "," not in text:
            raise ConfigError(
                f"{name}: an input is the index of a held-out example (0 to {len(x) - 1}) "
                f"or one example as {size} comma-separated numbers. Received: {text[:60]!r}.")
        rows.append(row.reshape(x.shape[1:]))
        labels.append(None)
    logits = model.predict(np.stack(rows), verbose=0)
    out = []
    for c, label in zip(np.argmax(logits, axis=-1), labels):
        out.append(str(int(c)) if label is None
                   else f"{int(c)} (held-out example {label[0]}, labelled {label[1]})")
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m tfdist.predict",
        description="Run a trained model on inputs: the recipe's predict(model, inputs, cfg) "
                    "on RUN_DIR/model.keras, one line per input.",
        epilog="examples: python -m tfdist.predict runs/digits_mlp/single 0 1 (the main job: "
               "the digit of held-out images 0 and 1); python -m tfdist.predict "
               "runs/numbers_to_words/single 305 42")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the model dir of a finished run")
    parser.add_argument("inputs", metavar="INPUT", nargs="+",
                        help="what to predict for, as the recipe reads it (numbers_to_words: "
                             "an integer; the classifiers (digits_mlp, ...): the index of a "
                             "held-out example, or one example as comma-separated numbers)")
    parser.add_argument("--recipe", default=None,
                        help="the recipe's name or file, when not where the run recorded it")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        lines = predict(args.run_dir, args.inputs, args.recipe)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return exit_codes.CONFIG
    for line in lines:
        print(line)
    return exit_codes.OK


if __name__ == "__main__":
    sys.exit(main())
