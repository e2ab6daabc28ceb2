"""`python -m tfdist.export RUN_DIR`: a backup's weights as a model Keras alone loads.

    python -m tfdist.export runs/model_parallel_mlp/pipeline-2                # sharded form
    python -m tfdist.export runs/model_parallel_mlp/pipeline-2 --form keras   # model.keras

A run interrupted before its end (or one whose final save you want in the
other form) has backups but perhaps no final model. This writes the newest
good backup (or `--backup FILE`) as the recipe's plain, unsplit model: the
sharded form (`model.json` + Keras's sharded `model.weights.json`, see
`tfdist.final_weights`) or `model.keras`, into `--out` (default
RUN_DIR/export). The model is built without values and each weight is read
from the backup as Keras reaches it (a tensor-parallel weight's pieces
joined, `tfdist.reshard`), so one weight at a time passes through this
process, whatever layout wrote the backup. The optimizer state is not
exported (the backup keeps it for resuming).

Everything that can be checked before TensorFlow starts is: the run dir, its
backups, the recipe, `--out`. Each refusal is one line and exit 2.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

from tfdist import exit_codes, recipe as recipe_lib
from tfdist.errors import CheckpointError, ConfigError
from tfdist.model_dir import BACKUP_DIR

FORMS = ("sharded", "keras")
OUT = "export"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tfdist.export",
        description="Write a run's backup as a model Keras loads alone, one weight at a time.")
    parser.add_argument("run_dir", help="the model dir a `python -m tfdist.train` run wrote")
    parser.add_argument("--backup", default=None,
                        help="a backup file of RUN_DIR/backup (default: the newest)")
    parser.add_argument("--form", default="sharded", choices=FORMS,
                        help="sharded: model.json + model.weights.json and its .weights.h5 "
                             "shards (any size); keras: one model.keras")
    parser.add_argument("--out", default=None, help=f"where to write (default RUN_DIR/{OUT})")
    parser.add_argument("--recipe", default=None,
                        help="the recipe's name or file, when the recorded one moved")
    return parser.parse_args(argv)


def check(args) -> tuple[list[str], str, object, dict]:
    """Pre-TensorFlow checks: (the backups to try, newest first; the output dir; the
    run's recipe and configuration).

    Raises:
        ConfigError: naming what is missing and what to do.
    """
    if not os.path.isdir(args.run_dir):
        raise ConfigError(f"run dir {args.run_dir}: no such directory. Pass the model dir a "
                          "`python -m tfdist.train` run wrote (its first line says "
                          "model_dir=...).")
    if args.backup:
        if not os.path.isfile(args.backup):
            raise ConfigError(f"--backup {args.backup}: no such file. Pass one of "
                              f"{os.path.join(args.run_dir, BACKUP_DIR)}/ckpt-*.npz, or leave "
                              "--backup out for the newest.")
        candidates = [args.backup]
    else:
        from tfdist.checkpoint import backup_paths

        candidates = list(reversed(backup_paths(os.path.join(args.run_dir, BACKUP_DIR))))
        if not candidates:
            raise ConfigError(f"run dir {args.run_dir}: has no backup to export (a run writes "
                              "them while it trains). A finished run's model is already in "
                              "it: model.keras, or model.json + model.weights.json.")
    out = args.out or os.path.join(args.run_dir, OUT)
    if os.path.exists(out) and not os.path.isdir(out):
        raise ConfigError(f"--out {out}: is a file. Pass a directory (created if missing).")
    from tfdist import predict

    record = predict.run_record(args.run_dir)
    recipe = predict.recipe_of(record, args.recipe)
    return candidates, out, recipe, {**recipe.DEFAULTS, **record["config"]}


def export(candidates: list[str], out: str, form: str, recipe, cfg: dict,
           log=print) -> list[str]:
    """Writes the first good backup of `candidates` into `out` in `form`; returns the files.

    Args:
        candidates: Backup files, the preferred first.
        out: The output directory (created if missing).
        form: One of FORMS.
        recipe: The run's recipe module; `cfg`: its configuration (the model's options).

    Raises:
        CheckpointError: when no candidate reads, or the backup does not fit
            the recipe's model (naming the first difference).
    """
    from tfdist import backup_layouts, checkpoint, final_weights
    from tfdist.compat.tf_startup_logs import import_tensorflow

    import_tensorflow()
    from tfdist.model_parallel import deferred

    plain = deferred.build_without_values(_builder(recipe, cfg))
    errors = []
    for path in candidates:
        try:
            # Whatever its layout (stage processes' or workers' parts), read as one
            # replica's arrays.
            meta, arrays = checkpoint.BackupStore.load(path)
            break
        except CheckpointError as e:
            errors.append(str(e))
    else:
        raise CheckpointError(errors[0])
    order = checkpoint.BackupStore.check_compatible(
        path, meta, {"model_signature": checkpoint.signature(plain.weights)})["model"]

    # Keyed by the recipe's model's paths (a Sequential's carry its name), matched to the
    # deserialised plain model's by `final_weights.weight_keys`.
    read = {v.path: final_weights.Lazy(v.shape, lambda step=step: backup_layouts.value_of(
        step, arrays, "model")) for v, step in zip(plain.weights, order)}
    os.makedirs(out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".export-", dir=out)
    try:
        if form == "sharded":
            names = final_weights.save_sharded(plain.to_json(), read, tmp)
            for name in final_weights.sharded_files(out):  # an older export's shards
                os.remove(os.path.join(out, name))
        else:
            names = final_weights.save_keras(plain.to_json(), read, tmp)
        for name in names:  # the index (or the one file) last
            os.replace(os.path.join(tmp, name), os.path.join(out, name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"tfdist.export: wrote {', '.join(names)} into {out} from {path} (step "
        f"{meta.get('state', {}).get('global_step', '?')})")
    return names


def _builder(recipe, cfg: dict):
    """What builds the recipe's model with all its variables: a subclassed model, which
    makes them at its first call, is called symbolically on the dataset's x."""
    import keras
    import tensorflow as tf

    def build():
        model = recipe_lib.build_model(recipe, cfg)
        if not model.weights:
            source = recipe_lib.build_dataset(recipe, cfg, "test")
            x = getattr(source, "dataset", source).element_spec[0]
            model(tf.nest.map_structure(
                lambda s: keras.KerasTensor((None, *s.shape), s.dtype.name), x))
        return model

    return build


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        candidates, out, recipe, cfg = check(args)
        export(candidates, out, args.form, recipe, cfg)
    except (ConfigError, CheckpointError) as e:
        print(f"tfdist.export: {e}", file=sys.stderr)
        return exit_codes.CONFIG
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
