"""A recipe that chooses its distribution in Keras's terms, for `python -m tfdist.train`.

A recipe may define `distribution(cfg)` returning a `keras.distribution`
`DataParallel`, `ModelParallel` or `LayoutMap`; it takes the place of the
`--strategy` and `--tensor-parallel` flags (`--devices N` says how many
devices `list_devices()` shows, as `TFDIST_DEVICES` does in a script). It is
read before TensorFlow's runtime starts and becomes tfdist's own options:

* DataParallel over D devices in one process: `--strategy mirrored --devices D`
  (`single` for one); over the job's processes: `--strategy multi_worker`.
* ModelParallel on a (1, M) mesh in one process: `--strategy model_parallel
  --devices M --tensor-parallel M`, once the built model shows that the
  layout map asks for what tfdist's tensor parallelism splits (`check_model`).
"""

from __future__ import annotations

import math

from tfdist.errors import ConfigError

REPLACED = ("strategy", "tensor_parallel")


def _where(recipe) -> str:
    return f"recipe {getattr(recipe, 'RECIPE_NAME', '?')}"


def distribution_of(recipe, cfg):
    """`recipe.distribution(cfg)` as a Distribution (a LayoutMap becomes a ModelParallel)."""
    import keras

    value = recipe.distribution(cfg)
    if isinstance(value, keras.distribution.LayoutMap):
        value = keras.distribution.ModelParallel(layout_map=value)
    if not isinstance(value, (keras.distribution.DataParallel, keras.distribution.ModelParallel)):
        raise ConfigError(
            f"{_where(recipe)}: distribution(cfg) must return a keras.distribution "
            f"DataParallel, ModelParallel or LayoutMap. Received: {type(value).__name__}.")
    return value


def options_for(distribution, processes: int) -> dict:
    """tfdist's options for a Keras distribution (strategy, devices, tensor_parallel)."""
    import keras

    from tfdist.keras_distribution import engine

    sizes = engine.mesh_sizes(distribution)
    devices = math.prod(sizes.values())
    axis, split = ((None, 1) if isinstance(distribution, keras.distribution.DataParallel)
                   else engine.model_axis(distribution))
    if split == 1:  # every weight whole: data parallel over every device
        if processes > 1:
            if devices != processes:
                raise ConfigError(
                    f"A DataParallel mesh of {devices} devices in a job of {processes} "
                    "processes: tfdist.train's multi_worker trains one device per process.")
            return {"strategy": "multi_worker"}
        return {"strategy": "mirrored" if devices > 1 else "single", "devices": devices}
    if processes > 1 or devices != split:
        raise ConfigError(
            f"A ModelParallel mesh {sizes} over {processes} process(es): tfdist.train maps "
            "ModelParallel on a (1, N) mesh in one process. Split copies across processes "
            "work from your own script (docs/keras_distribution.md).")
    return {"strategy": "model_parallel", "devices": split, "tensor_parallel": split}


def apply(recipe, cfg, cluster):
    """`cfg` with the options `recipe.distribution(cfg)` stands for (unchanged without it).

    Raises:
        ConfigError: for a flag the distribution replaces, or a distribution
            tfdist.train cannot map.
    """
    if not hasattr(recipe, "distribution"):
        return cfg
    clash = sorted(k for k in REPLACED if k in cfg.given)
    if clash:
        flags = ", ".join("--" + k.replace("_", "-") for k in clash)
        raise ConfigError(
            f"{_where(recipe)} chooses its distribution (distribution(cfg) returns a "
            f"keras.distribution); {flags} cannot be given with it. Drop {flags}, or remove "
            "distribution() from the recipe.")
    from tfdist.keras_distribution import backend

    devices = cfg.typed.adapter.devices
    if devices > 1:  # what list_devices() shows, as TFDIST_DEVICES would
        backend.configure_runtime(devices)
    options = options_for(distribution_of(recipe, cfg), cluster.num_workers)
    from tfdist.config import Config

    if cluster.is_chief:
        flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in options.items())
        print(f"tfdist: {_where(recipe)}'s keras.distribution -> {flags}", flush=True)
    return Config({**cfg, **options}, cfg.options, given={*cfg.given, *options})


def check_model(recipe, cfg, model) -> None:
    """Refuses a LayoutMap that asks for other splits than tfdist.train's tensor parallelism makes.

    `--tensor-parallel` splits every feed-forward Dense pair (column, then
    row) and every attention layer by heads; a layout map must ask for the
    same Dense splits, with no attention layer in the model.
    """
    import keras

    from tfdist.keras_distribution import engine, layouts, split
    from tfdist.model_parallel import surgery

    distribution = distribution_of(recipe, cfg)
    if not engine.is_split(distribution):
        return
    asked = {s.layer: s.role for s in layouts.plan(
        split.weights_of(model, distribution), engine.mesh_sizes(distribution),
        distribution.batch_dim_name)}
    made = surgery.feed_forward_pairs(model)
    attention = [layer.name for layer in model.layers
                 if isinstance(layer, keras.layers.MultiHeadAttention)]
    if asked != made or attention:
        raise ConfigError(
            f"{_where(recipe)}'s LayoutMap splits {asked or 'nothing'}; tfdist.train's tensor "
            f"parallelism splits the feed-forward Dense pairs {made or '(none)'}"
            + (f" and the attention layers {attention} by heads" if attention else "")
            + ". Make the layout map ask for exactly those, or train from your own script "
            "with keras.distribution, where any Dense split works (docs/keras_distribution.md).")
