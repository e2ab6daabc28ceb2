"""A recipe's `distribution(cfg)` read as tfdist.train's options, or refused (no process)."""

from __future__ import annotations

import types

import pytest

import tfdist  # noqa: F401
from tfdist import config
from tfdist.errors import ConfigError
from tfdist.keras_distribution import recipes


def _model_parallel(devices, layouts, shape=None):
    import keras

    mesh = keras.distribution.DeviceMesh(shape or (1, len(devices)), ["batch", "model"], devices)
    layout_map = keras.distribution.LayoutMap(mesh)
    for path, axes in layouts.items():
        layout_map[path] = axes
    return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")


def test_data_parallel_becomes_mirrored_single_or_multi_worker():
    import keras

    two = keras.distribution.DataParallel(devices=["cpu:0", "cpu:1"])
    assert recipes.options_for(two, processes=1) == {"strategy": "mirrored", "devices": 2}
    one = keras.distribution.DataParallel(devices=["cpu:0"])
    assert recipes.options_for(one, processes=1) == {"strategy": "single", "devices": 1}
    assert recipes.options_for(two, processes=2) == {"strategy": "multi_worker"}


def test_model_parallel_becomes_tensor_parallel_in_one_process():
    mp = _model_parallel(["cpu:0", "cpu:1"], {"d1/kernel": (None, "model")})
    assert recipes.options_for(mp, processes=1) == {
        "strategy": "model_parallel", "devices": 2, "tensor_parallel": 2}
    with pytest.raises(ConfigError, match=r"\(1, N\) mesh in one process"):
        recipes.options_for(_model_parallel([f"cpu:{i}" for i in range(4)], {}, (2, 2)), 1)


def _recipe(distribution):
    return types.SimpleNamespace(RECIPE_NAME="mine", distribution=lambda cfg: distribution)


def test_a_flag_the_distribution_replaces_is_refused():
    import keras

    recipe = _recipe(keras.distribution.DataParallel(devices=["cpu:0"]))
    cfg = config.merge({}, ["--strategy", "mirrored"], "recipe mine")
    cluster = types.SimpleNamespace(num_workers=1, is_chief=True)
    with pytest.raises(ConfigError, match="recipe mine chooses its distribution.*--strategy"):
        recipes.apply(recipe, cfg, cluster)
    with pytest.raises(ConfigError, match="must return a keras.distribution.*Received: str"):
        recipes.apply(_recipe("mirrored"), config.merge({}, [], "recipe mine"), cluster)


def test_the_layout_map_must_ask_for_the_feed_forward_pairs():
    import keras

    inputs = keras.Input((8,))
    h = keras.layers.Dense(6, name="hidden")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3, name="logits")(h))
    devices = ["cpu:0", "cpu:1"]
    both = _model_parallel(devices, {"hidden/kernel": (None, "model"),
                                     "logits/kernel": ("model", None)})
    recipes.check_model(_recipe(both), {}, model)  # what --tensor-parallel 2 splits
    half = _model_parallel(devices, {"hidden/kernel": (None, "model")})
    with pytest.raises(ConfigError, match=r"splits \{'hidden': 'column'\}.*pairs \{'hidden'"):
        recipes.check_model(_recipe(half), {}, model)
