"""The run pipeline's loop interface and the steps every loop shares.

A strategy adapter declares its loop kind (`Adapter.loop`) and which tasks run
it (`Adapter.runs_loop`; the others `serve`); the run pipeline
(`tfdist.run.trainer.train`) checks, inspects and claims the model dir, then
hands a `Run` to the `Loop` of that kind: Keras `fit` on every training
process (`tfdist.run.trainer.FitLoop`), the chief driving stages that serve
(`tfdist.run.trainer.StageLoop`) or the chief scheduling steps on workers that
serve (`tfdist.run.coordinator.CoordinatorLoop`). They start TensorFlow, set up
the runtime, serve, log their run line and finish through the same functions
here, so every strategy gets the same threads, determinism, seed, precision,
evaluation, metrics.json and chief-only model save. Imports no loop (no import
circle); no TensorFlow at module level.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from tfdist.writer import ChiefWriter
from tfdist.errors import ConfigError


@dataclasses.dataclass
class Run:
    """What a loop is given: the checked run, its model dir claimed.

    Attributes:
        recipe: The loaded recipe module.
        cfg: The merged, checked configuration.
        cluster: This process's ClusterInfo.
        writer: The run's one chief-only writer (`writer.ChiefWriter`): every
            file in the model dir goes through it; the chief has claimed the dir.
        choice: The `tfdist.strategies.Choice` of adapters `--strategy` may become.
        callbacks: Extra Keras callbacks from the caller (`fit` loops).
        found: What the model dir holds (`tfdist.run.run_dir.Found`).
        settings: `cfg` as typed sections (`tfdist.settings.Settings`), read once.
    """

    recipe: object
    cfg: dict
    cluster: object
    writer: ChiefWriter
    choice: object
    callbacks: list = dataclasses.field(default_factory=list)
    found: object = None
    settings: object = None

    def __post_init__(self):
        if self.settings is None:
            from tfdist.settings import Settings

            self.settings = Settings.of(self.cfg)

    @property
    def model_dir(self) -> str:
        """The model dir."""
        return self.writer.model_dir


class Loop:
    """One way to run the training steps; the run pipeline around it is shared."""

    kind: str = ""

    def run(self, run: Run):
        """Trains and finishes; returns a `tfdist.run.types.Result`."""
        raise NotImplementedError


def log(cluster, message: str) -> None:
    """'tfdist: message' on the chief."""
    if cluster.is_chief:
        print(f"tfdist: {message}", flush=True)


def run_line(fields: dict) -> str:
    """Pure function: 'key=value ...' for the line each run starts with."""
    return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in fields.items())


def start_tensorflow(settings):
    """Imports TensorFlow quietly (unless --tf-logs); returns the Console."""
    from tfdist import cluster as cluster_lib
    from tfdist.compat.tf_startup_logs import import_tensorflow

    console = cluster_lib.detect_console()
    import_tensorflow(show_logs=settings.logs.tf_logs or console.tf_logs)
    return console


def serve(run: Run):
    """This process's part where its adapter does not run the loop (`runs_loop` False):
    TensorFlow started, the adapter serves (its `serve`) until the chief has ended."""
    start_tensorflow(run.settings)
    adapter = run.choice.candidates[0]
    return adapter(run.cluster, run.settings.adapter).serve(run.settings.runtime.threads)


def set_up(settings, cpu_devices: int | None = None) -> None:
    """Threads, logical CPU devices, determinism, seed and precision: before any op.

    Args:
        settings: The run's `tfdist.settings.Settings`.
        cpu_devices: Split the CPU into this many logical devices (None: no split).
    """
    import keras
    import tensorflow as tf

    from tfdist.strategies.devices import configure_runtime

    runtime = settings.runtime
    configure_runtime(cpu_devices=cpu_devices, intra_op_threads=runtime.threads or None,
                      inter_op_threads=runtime.inter_op_threads or None)
    if runtime.deterministic:
        tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(settings.training.seed)
    # float16 compute needs loss scaling: Keras's compile wraps the optimizer in
    # a LossScaleOptimizer for "mixed_float16" (the coordinator scales its own
    # loss); bfloat16 has float32's range.
    keras.mixed_precision.set_global_policy(settings.optimization.precision)


def finish(model, test_ds, metrics: dict, writer: ChiefWriter, cluster, recipe=None,
           cfg: dict | None = None, final_weights: str = "auto") -> dict:
    """Evaluates, then the chief writes the model and metrics.json (atomically).

    Args:
        model: The trained model (compiled; evaluated on every process that calls this).
        test_ds: The batched test dataset.
        metrics: The loop's metrics; "test" is added.
        writer: The run's chief-only writer.
        cluster: This process's ClusterInfo.
        recipe: The recipe; its optional `evaluate(model, cfg)` adds its own metrics.
        cfg: The configuration `evaluate` is given.
        final_weights: --final-weights (`save_final`).

    Returns:
        `metrics` with "test": the evaluation as floats, and the recipe's own metrics.
    """
    evaluation = model.evaluate(test_ds, verbose=0, return_dict=True)
    metrics = {**metrics, "test": {k: float(v) for k, v in evaluation.items()}}
    if recipe is not None:
        from tfdist.run.run_dir import run_config

        # What `python -m tfdist.predict` rebuilds the recipe and its cfg from.
        metrics.setdefault("recipe_file", getattr(recipe, "RECIPE_FILE", None))
        metrics.setdefault("config", run_config(cfg or {}))
        metrics.update(recipe_metrics(recipe, model, cfg, metrics))
    saved = save_final(model, writer, final_weights)
    path = writer.write_json("metrics.json", metrics)
    if path:
        log(cluster, f"test {evaluation}; wrote {saved} and {path}")
    sys.stdout.flush()
    return metrics


def save_final(model, writer: ChiefWriter, asked: str = "auto") -> str:
    """The chief writes the trained model: model.keras, or (a model larger than this
    process, or --final-weights sharded) model.json + model.weights.json and its shards
    (`tfdist.final_weights`); the other form's files are removed. Returns what
    it wrote, in words."""
    from tfdist import final_weights as fw
    from tfdist import memory_limit

    from tfdist.zero import parameters

    every, split, served = parameters.whole_view(model.weights)
    if split is not None:  # --shard parameters: the chief writes each weight as gathered
        return split.chief_writes(served, writer.is_chief,
                                  lambda: _save_whole(model, writer, asked, every)) or ""
    unsplit = getattr(model, "unsplit", None)
    source = unsplit() if unsplit else model
    headroom = memory_limit.headroom_bytes() if asked == "auto" and writer.is_chief else None
    if fw.final_form(asked, fw.weight_bytes(source), headroom) == "keras":
        for name in fw.sharded_files(writer.model_dir):
            writer.remove(name)
        writer.save_model(model)
        return writer.path("model.keras")
    architecture = getattr(model, "plain_json", None) or model.to_json()
    writer.write_files(lambda tmp: fw.save_sharded(architecture, fw.values_of(source), tmp))
    writer.remove("model.keras")
    return f"{writer.path(fw.ARCHITECTURE)} and {writer.path(fw.WEIGHTS)} (sharded weights)"


def _save_whole(model, writer: ChiefWriter, asked: str, every: list) -> str:
    """`save_final` of a model whose weights are split across workers (on the chief, while
    the others serve): each weight read whole when Keras's writer reaches it."""
    import numpy as np

    from tfdist import final_weights as fw
    from tfdist import memory_limit
    from tfdist.zero import parameters

    read = parameters.whole_values(model, every)
    plain_bytes = sum(int(np.prod(v.shape, dtype=np.int64)) * np.dtype(v.dtype).itemsize
                      for v in every)
    headroom = memory_limit.headroom_bytes() if asked == "auto" else None
    architecture = model.to_json()
    if fw.final_form(asked, plain_bytes, headroom) == "keras":
        for name in fw.sharded_files(writer.model_dir):
            writer.remove(name)
        writer.write_files(lambda tmp: fw.save_keras(architecture, read, tmp))
        return writer.path("model.keras")
    writer.write_files(lambda tmp: fw.save_sharded(architecture, read, tmp))
    writer.remove("model.keras")
    return f"{writer.path(fw.ARCHITECTURE)} and {writer.path(fw.WEIGHTS)} (sharded weights)"


def recipe_metrics(recipe, model, cfg: dict, metrics: dict) -> dict:
    """The recipe's `evaluate(model, cfg)`: metrics beyond Keras's evaluate (say, exact match
    of greedy decoding), computed on every process after training; {} when it has none.

    Raises:
        ConfigError: naming the recipe when it returns something other than a dict of
            JSON values, or a key tfdist's metrics.json already has.
    """
    evaluate = getattr(recipe, "evaluate", None)
    if evaluate is None:
        return {}
    where = f"recipe {getattr(recipe, 'RECIPE_FILE', getattr(recipe, 'RECIPE_NAME', '?'))}"
    if not callable(evaluate):
        raise ConfigError(f"{where}: evaluate must be a function. Received: "
                          f"{type(evaluate).__name__}.")
    extra = evaluate(model, cfg)
    if not isinstance(extra, dict):
        raise ConfigError(f"{where}: evaluate(model, cfg) must return a dict of metrics for "
                          f"metrics.json. Received: {type(extra).__name__}.")
    clash = sorted(set(extra) & set(metrics))
    if clash:
        raise ConfigError(f"{where}: evaluate(model, cfg) returned {clash}, which tfdist's "
                          "metrics.json already has; rename them.")
    try:
        json.dumps(extra)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: evaluate(model, cfg) must return JSON values (float, "
                          f"int, str, lists, dicts): {e}.") from None
    return extra
