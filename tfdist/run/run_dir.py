"""What a model dir already holds, against what this command asks (no TensorFlow).

Every backup records the run's configuration (`run_config`). Before
TensorFlow starts, a rerun compares it with the newest backup's record:

* no backup: train from the start;
* the same configuration, unfinished: resume (the trainer restores it);
* the same configuration, finished (its epochs done, at an epoch end, and its
  metrics.json, written after the final model, records that step: `final_written`):
  "already finished (N epochs), nothing to do"; exit 0, nothing rewritten but
  a --final-weights form it lacks (written from the last backup, `missing_form`);
  a larger --epochs extends it, and says so (`epochs_change_line`);
* its epochs done but its final model not written (the final save failed):
  resume, train no step, evaluate and write the model (`Found.unsaved_end`);
* a different configuration (the options that define a run: the rule is
  `tfdist.config.RERUN_FREE`): an error naming each difference, offering
  --no-resume (start over there) or another --model-dir;
* another global batch with --rescale-lr-on-batch-change: resume, the
  learning rate rescaled from the backup's (`resume_learning_rate`), the
  data position mapped in examples (`tfdist.checkpoint.rebatch`).

The default model dir is `runs/RECIPE/STRATEGY[-Nw][-Mps][-Ddev][-Ttp][-slurm|-tf_config]`
(stages across processes: `STRATEGY-Pst[-Ccp]`), named from what runs and its
layout (`default_model_dir`), so the README's launch modes and layouts never
meet in one directory; what is left to collide there (learning rate, batch,
precision, ...) is refused by name.
A run moved to another launch shape (fewer workers, another data-parallel
strategy) names its old directory with --model-dir and resumes there.
"""

from __future__ import annotations

import dataclasses
import os

from tfdist import config, strategies
from tfdist.data import scale_learning_rate
from tfdist.errors import CheckpointError, ConfigError
from tfdist.option import flag
from tfdist.settings import Settings

# The rerun rule (`tfdist.config.RERUN_FREE`, `config.RERUN_RULE`): options a rerun
# may change freely are not part of the recorded configuration.
RUN_CONTROL = frozenset(config.RERUN_FREE)

# What --rescale-lr-on-batch-change lets a resumed run change: the batch, and
# the rule its learning rate follows the batch by.
BATCH_CHANGE = frozenset({"global_batch_size", "lr_scaling"})

# Synchronous strategies compute the same math on any number of replicas or
# pipeline stages at one global batch (every global batch holds the same
# examples, one set of weights), so a run may move between them and between
# replica and stage counts: the strategy, --devices and the pipeline's layout are
# how it is run, not what it computes. `auto` resolves to one of them (or to an
# asynchronous strategy, whose backups name their recipe and variables anyway).
# The adapters say which (`Adapter.portable`). Tensor parallelism is layout too: a
# backup records each shard's slice of its weight (`tfdist.reshard`).
DATA_PARALLEL = frozenset({"auto", *(n for n, a in strategies.REGISTRY.items() if a.portable)})
LAYOUT = config.LAYOUT


def run_config(cfg: dict) -> dict:
    """Pure function: the options that define what a run computes (instruments' never do)."""
    return {k: v for k, v in sorted(cfg.items()) if not config.rerun_may_change(k)}


def default_model_dir(recipe_name: str, cfg: dict, cluster, gpus_possible: bool = True) -> str:
    """Pure function: runs/RECIPE/NAME, NAME saying what runs, so that layouts never share one.

    NAME is STRATEGY[-Nw][-Mps][-Ddev][-Ttp][-slurm|-tf_config], or for
    stages across processes STRATEGY-Pst[-Ccp][...] (`layout_name`):
    the strategy resolved, the training processes when several (under ps
    tasks: the workers besides the chief) and the ps tasks, --devices, the
    tensor-parallel degree, and who started the tasks when not
    `tfdist.launch` (Slurm, or a TF_CONFIG written by hand): different jobs a
    user moves between on purpose (`--model-dir`), not a rerun. A requeued
    Slurm job keeps its task count, so its dir; the same command on the same
    machine gets the same name.

    Args:
        recipe_name: The recipe.
        cfg: The merged configuration (read as `Settings`: strategy, devices).
        cluster: This process's ClusterInfo.
        gpus_possible: Whether TensorFlow may find a GPU here
            (`tfdist.cluster.local.gpus_possible`).
    """
    # `auto` under a cluster or with --devices is one adapter already. Alone on
    # this machine it is single or mirrored by the GPUs TensorFlow will count,
    # but the dir is named before TensorFlow starts (a finished run exits
    # without it): where a GPU is possible it stays "auto" (a rerun still
    # finds it), where none can be it is what will run.
    settings = Settings.of(cfg)
    asked, devices = settings.strategy, settings.adapter.devices
    names = strategies.possible_names(asked, cluster, devices)
    if len(names) == 1:
        (name,) = names
    elif not gpus_possible:
        name = strategies.resolve_name(asked, cluster, devices, gpus=0)
    else:
        name = asked
    num_ps = len((cluster.tf_config or {}).get("cluster", {}).get("ps", []))
    # tfdist.launch's -n, not the survivors --min-workers relaunched: they go on with the run.
    workers = cluster.training_workers if num_ps else (cluster.job_workers
                                                       or cluster.num_workers)
    name += layout_name(name, settings, workers, num_ps)
    if cluster.source == "slurm":
        name += "-slurm"
    elif cluster.source == "tf_config" and cluster.launcher is None:
        name += "-tf_config"
    return os.path.join("runs", recipe_name, name)


def layout_name(strategy: str, settings: Settings, workers: int, num_ps: int = 0) -> str:
    """Pure function: the layout part of a run dir's name ("-4w-1ps", "-2dev-2tp", "-2st-2cp").

    The training processes when several, the ps tasks, --devices, unless the
    adapter names its own layout (`Adapter.dir_layout`: stages in processes
    name their stages and copies); then the tensor-parallel degree (`-Ttp`), which stores
    each weight as shards.

    Args:
        strategy: The adapter's name (or "auto").
        settings: The run's options.
        workers: The job's training processes (tfdist.launch's -n).
        num_ps: Its parameter servers.
    """
    options = settings.adapter
    adapter = strategies.REGISTRY.get(strategy)
    out = adapter.dir_layout(settings, workers) if adapter and not num_ps else None
    if out is None:
        out = f"-{workers}w" if workers > 1 or num_ps else ""
        out += f"-{num_ps}ps" if num_ps else ""
        out += f"-{options.devices}dev" if options.devices else ""
    if (options.tensor_parallel or 1) > 1:
        out += f"-{options.tensor_parallel}tp"
    return out


def differences(recorded: dict, current: dict, batch_change_ok: bool = False) -> list[str]:
    """Pure function: 'key: A there, B here' for each option that differs.

    `strategy: auto` matches any strategy (auto picks by environment); between
    synchronous strategies neither the strategy nor its layout counts (see
    `DATA_PARALLEL`, `LAYOUT`); keys only one side knows (an option added since) are ignored;
    with `batch_change_ok` (--rescale-lr-on-batch-change) neither do `BATCH_CHANGE`'s.
    """
    out = []
    portable = {recorded.get("strategy"), current.get("strategy")} <= DATA_PARALLEL
    for key in sorted(recorded.keys() & current.keys()):
        a, b = recorded[key], current[key]
        if key == "strategy" and "auto" in (a, b):
            continue
        if key in LAYOUT and portable:
            continue
        if key in BATCH_CHANGE and batch_change_ok:
            continue
        if a != b:
            out.append(f"--{key.replace('_', '-')} {a!r} there, {b!r} here")
    return out


@dataclasses.dataclass(frozen=True)
class Found:
    """What the model dir holds for this run.

    Attributes:
        backup: The newest readable backup, or None.
        epochs_done: Completed epochs in it.
        finished: It ends at an epoch end with at least `epochs` epochs done, and its
            final model is written (`final_written`).
        epochs_asked: The --epochs of the run that wrote it (None if unknown).
        step_in_epoch: Steps done in the epoch it stopped in.
        global_batch_size: The global batch it was written at (None if unknown).
        learning_rate: The learning rate it trained with (None if unknown).
        unsaved_end: Its epochs are done but its final model was not written
            (the final save failed, or was cut short): the rerun writes it.
    """

    backup: str | None = None
    epochs_done: int = 0
    finished: bool = False
    epochs_asked: int | None = None
    step_in_epoch: int = 0
    global_batch_size: int | None = None
    learning_rate: float | None = None
    unsaved_end: bool = False


METRICS = "metrics.json"


def final_written(model_dir: str, global_step: int) -> bool:
    """Whether the run's end is in `model_dir`: its metrics.json, written after the final
    model is in place (`tfdist.run.loop.finish`), records `global_step`.

    This is the run's "finished" mark: a backup at the last epoch's end alone is
    not, so a run whose final save failed is finished by its rerun.
    """
    import json

    try:
        with open(os.path.join(model_dir, METRICS), encoding="utf-8") as f:
            return json.load(f).get("global_step") == global_step
    except (OSError, ValueError, AttributeError):
        return False


def missing_form(model_dir: str, asked: str) -> str | None:
    """The final-weights form --final-weights `asked` names that `model_dir` lacks: "keras"
    (no model.keras), "sharded" (no model.json + model.weights.json), or None (present, or
    `auto`, which keeps whichever form the run wrote)."""
    from tfdist import final_weights as fw

    if asked == "keras" and not os.path.isfile(os.path.join(model_dir, fw.KERAS)):
        return "keras"
    if asked == "sharded" and not all(os.path.isfile(os.path.join(model_dir, n))
                                      for n in (fw.ARCHITECTURE, fw.WEIGHTS)):
        return "sharded"
    return None


def idle_options(given) -> list[str]:
    """Pure function: the memory and speed options among `given` (the options set on the
    command line), as flags: a finished run has no training for them to act on."""
    return [flag(k) for k in sorted(given) if config.RERUN_FREE.get(k) == "memory"]


def epochs_change_line(found: Found, epochs: int, model_dir: str) -> str | None:
    """Pure function: what a rerun asking another --epochs than its backup's run does.

    Args:
        found: What the model dir holds (not `finished`: that run has nothing to do).
        epochs: This run's --epochs.
        model_dir: The run's directory, named in the line.

    Returns:
        None when the backup's run asked the same (or is unknown); otherwise
        one line: extending, shortening, or already past `epochs`, where the
        trainer trains no step and writes the model as the backup holds it.
    """
    asked, done = found.epochs_asked, found.epochs_done
    if asked is None or asked == epochs:
        return None
    to = f"{epochs} epoch{'s' if epochs != 1 else ''}"
    if epochs > asked:
        return f"extending the run in {model_dir} from {asked} to {to} ({done} done)"
    if done < epochs:
        return (f"shortening the run in {model_dir} from {asked} to {to} ({done} done): it "
                f"stops after epoch {epochs}")
    # Mid-epoch at or past `epochs` (at an epoch end that would be `finished`).
    return (f"the run in {model_dir} is already past {to} ({done} done and "
            f"{found.step_in_epoch} steps of epoch {done + 1}, of the {asked} asked before): "
            f"no step is trained; its model as backed up is evaluated and written. Pass "
            f"--epochs N (N > {done}) to train it further")


def recorded_learning_rate(record: dict) -> float | None:
    """Pure function: the learning rate a backup's run trained with.

    Recorded since --rescale-lr-on-batch-change (a rescaled run's rate is not
    what its options give); computed from the recorded options before that.
    """
    if "learning_rate" in record:
        return float(record["learning_rate"])
    conf = record.get("config", {})
    try:
        effective = conf["global_batch_size"] * conf.get("accumulate", 1)
        return scale_learning_rate(conf["learning_rate"], effective,
                                   conf.get("base_batch_size") or effective,
                                   conf.get("lr_scaling", "none"))
    except (KeyError, TypeError, ConfigError):
        return None


def resume_learning_rate(found: Found, cfg: dict, computed: float) -> tuple[float, str | None]:
    """Pure function: the learning rate a run resuming `found` trains with.

    The backup's own rate (a rescaled run's rate stays rescaled on every
    rerun); at another global batch that rate rescaled by --lr-scaling,
    relative to the backup's batch. `computed` (from the options) when there
    is no backup or it did not record enough.

    Returns:
        (learning rate, the line that explains a batch change, or None).
    """
    if found.learning_rate is None or found.global_batch_size is None:
        return computed, None
    settings = Settings.of(cfg)
    old, new = found.global_batch_size, settings.training.global_batch_size
    rule = settings.optimization.lr_scaling
    if old == new:
        return found.learning_rate, None
    lr = scale_learning_rate(found.learning_rate, new, old, rule)
    return lr, (f"--rescale-lr-on-batch-change: resuming a backup written at global batch "
                f"{old} at global batch {new}; learning rate {found.learning_rate:g} -> {lr:g} "
                f"(--lr-scaling {rule}, relative to the backup's batch and "
                "learning rate). The math now differs from an uninterrupted run at either "
                "batch.")


def inspect(model_dir: str, cfg: dict, recipe_name: str | None = None) -> Found:
    """Reads the newest backup's record and checks it against this run.

    A backup that cannot be read is left to the trainer's resume (which falls
    back past it or explains); backups from before configurations were
    recorded are not compared.

    Raises:
        ConfigError: when the recorded configuration differs, naming each option.
    """
    from tfdist.checkpoint import BackupStore
    from tfdist.writer import ChiefWriter

    settings = Settings.of(cfg)  # `cfg` itself is what a backup records (`run_config`)
    if not settings.backup.resume:
        return Found()
    store = BackupStore(ChiefWriter(model_dir, is_chief=False))  # reads only
    paths = store.paths()
    if not paths:
        return Found()
    try:
        # The record alone: every process reads it, and a single-file backup holds every
        # weight (the trainer's resume checks the arrays).
        record = BackupStore.read_record(paths[-1])
    except CheckpointError:
        return Found(backup=paths[-1])
    if recipe_name and record.get("recipe") not in (None, recipe_name):
        return Found(backup=paths[-1])  # another recipe: the trainer's resume names it
    diff = differences(record.get("config", {}), run_config(cfg),
                       settings.backup.rescale_lr_on_batch_change)
    if diff:
        raise ConfigError(
            f"{model_dir} holds a run with another configuration ({paths[-1]}): "
            f"{'; '.join(diff)}. Pass --no-resume to start over there (its backups are "
            "deleted), or --model-dir DIR for a separate run."
            + (" To go on at another global batch, pass --rescale-lr-on-batch-change "
               "(the learning rate is rescaled by --lr-scaling; the math then differs)."
               if any(d.startswith("--global-batch-size ") for d in diff) else ""))
    state = record.get("state", {})
    done = int(state.get("epoch", 0))
    at_end = state.get("step_in_epoch", 0) == 0 and done >= settings.training.epochs
    written = at_end and final_written(model_dir, state.get("global_step"))
    return Found(backup=paths[-1], epochs_done=done, finished=written,
                 unsaved_end=at_end and not written,
                 epochs_asked=record.get("epochs"),
                 step_in_epoch=int(state.get("step_in_epoch", 0)),
                 global_batch_size=record.get("global_batch_size"),
                 learning_rate=recorded_learning_rate(record))
