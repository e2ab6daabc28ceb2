"""Model surgery: a model cloned onto devices (maybe tensor-parallel), weights copied, shards gathered.

`placed_clone` is how a model is split: every layer a fresh copy on its
stage's device, attention layers and feed-forward Dense pairs
(`feed_forward_pairs`) replaced by their tensor-parallel layers
(`tfdist.model_parallel.tensor_parallel`) where a stage has several devices,
and the original's weights copied in. `gather_model` turns a split model back
into the plain one (what a split model saves; it loads with Keras alone).

The layers themselves know nothing of whole models; this module knows the
layers, `placement` (one layer on one device) and `deferred` (a model built
without values), and none of them imports it.
"""

from __future__ import annotations

from tfdist.model_parallel import graph as graph_lib
from tfdist.model_parallel import deferred, placement, tensor_parallel


def placed_clone(model, device_of: dict, graph=None):
    """A copy of `model` whose every layer is a fresh copy built on its device, with its weights.

    Copies come from each layer's config, are placed with `place_layer`
    (variables and compute), built as `keras.models.clone_model` rewires the
    graph, and given the original's weights, so a split model starts exactly
    where the unsplit one does, and saves as a plain Keras model. A layer
    given several devices is made tensor-parallel over them
    (`tensor_parallel_clone_function`: attention by heads,
    feed-forward Dense pairs by units; other layers on the first device).

    Args:
        model: A built functional or Sequential Keras model.
        device_of: layer name -> device, or a tuple of devices (tensor parallel).
        graph: `graph.from_keras(model)`, when the caller has it (a split builds it
            once and hands it down).
    """
    import keras

    groups = {name: (d,) if isinstance(d, str) else tuple(d) for name, d in device_of.items()}
    placement.check_devices(sorted({d for group in groups.values() for d in group}))
    placement.check_regularizers(model)
    roles = (feed_forward_pairs(model, graph)
             if any(len(g) > 1 for g in groups.values()) else {})
    without_values = deferred.has_deferred(model)
    clones = {g: tensor_parallel_clone_function(g, roles, with_weights=not without_values)
              for g in set(groups.values())}

    def copy(layer):
        if isinstance(layer, keras.layers.InputLayer):
            return layer.__class__.from_config(layer.get_config())
        return clones[groups[layer.name]](layer)

    if without_values:  # built without values: each made where it lives
        clone = deferred.build_without_values(
            lambda: keras.models.clone_model(model, clone_function=copy))
        deferred.initialize_like(model, clone)
        return clone
    clone = keras.models.clone_model(model, clone_function=copy)
    copy_weights(model, clone)
    return clone


def feed_forward_pairs(model, graph=None) -> dict[str, str]:
    """layer name -> "column" / "row" for the feed-forward Dense pairs of a functional
    model (`graph`: its `graph.from_keras`, built here when None)."""
    import keras

    dense = {layer.name for layer in model.layers if type(layer) is keras.layers.Dense}
    return graph_lib.dense_pairs(graph if graph is not None else graph_lib.from_keras(model),
                                 dense)


def parallel_copy(layer, devices, role: str | None = None, with_weights: bool = True):
    """The tensor-parallel copy of a built layer over `devices`, with its weights
    (unless `with_weights` is False); else None.

    A `keras.layers.MultiHeadAttention` splits by heads; a `keras.layers.Dense`
    with `role` "column" (the first of a feed-forward pair) splits its units,
    with "row" (the second) its input features. Other layers: None.
    """
    import keras

    classes = tensor_parallel.layer_classes()
    if type(layer) is keras.layers.MultiHeadAttention:
        return classes["HeadParallelAttention"].from_layer(layer, devices, with_weights)
    if type(layer) is keras.layers.Dense and role == "column":
        return classes["ColumnParallelDense"].from_layer(layer, devices, gather_output=True,
                                                         with_weights=with_weights)
    if type(layer) is keras.layers.Dense and role == "row":
        return classes["RowParallelDense"].from_layer(layer, devices, input_is_parallel=False,
                                                      with_weights=with_weights)
    return None


def tensor_parallel_clone_function(devices, roles: dict[str, str] | None = None,
                                   with_weights: bool = True):
    """A `clone_function` for `keras.models.clone_model`: the model tensor-parallel over `devices`.

    MultiHeadAttention layers and the Dense layers `roles` names (from
    `feed_forward_pairs(model)`) become their tensor-parallel copies, built
    with their weights sharded over `devices`; every other layer becomes a
    fresh copy from its config placed on devices[0] (`place_layer`), built
    by the clone, whose weights `copy_weights` then sets.

    Args:
        devices: The devices of the shards (at least one).
        roles: layer name -> "column" | "row"; None: no Dense is split.
        with_weights: False for a model built without values: the shards get
            their initial values later (`deferred.initialize_like`).
    """
    import keras

    devices, roles = list(devices), dict(roles or {})

    def clone(layer):
        if isinstance(layer, keras.layers.InputLayer):
            return layer.__class__.from_config(layer.get_config())
        copy = (parallel_copy(layer, devices, roles.get(layer.name), with_weights)
                if len(devices) > 1 else None)
        return copy if copy is not None else placement.placed_copy(layer, devices[0])

    return clone


def copy_weights(source, clone) -> None:
    """Gives each layer of `clone` the weights of the layer of the same name in `source`.

    Tensor-parallel layers on either side convert (their plain weights);
    a clone's tensor-parallel layer built by `parallel_copy` has them already.
    """
    for layer in clone.layers:
        if not layer.weights:
            continue
        src = source.get_layer(layer.name)
        if src is layer:
            continue
        weights = src.plain_weights() if tensor_parallel.is_tensor_parallel(src) else src.get_weights()
        if tensor_parallel.is_tensor_parallel(layer):
            layer.set_plain_weights(weights)
        else:
            layer.set_weights(weights)


def gather_model(model):
    """The plain Keras model: every tensor-parallel layer replaced by its plain equivalent.

    Weights are gathered from the shards (a copy: later training of `model`
    does not reach it). A model without tensor-parallel layers is returned
    as it is. What a split model saves: it loads with Keras alone.
    """
    import keras

    if not any(tensor_parallel.is_tensor_parallel(layer) for layer in model.layers):
        return model

    def plain(layer):
        if tensor_parallel.is_tensor_parallel(layer):
            return layer.to_plain()
        return layer.__class__.from_config(layer.get_config())

    gathered = keras.models.clone_model(model, clone_function=plain)
    copy_weights(model, gathered)
    return gathered
