"""What a recipe's model costs: parameters, gradient bytes, training FLOPs per example.

Shared by `bench comm` (its prediction) and `bench scaling` (the --hosts report).
"""

from __future__ import annotations


def model_stats(recipe_name: str) -> dict:
    """Parameters, gradient bytes and training FLOPs per example of a recipe's model."""
    from tfdist import parameters
    from tfdist import recipe as recipe_lib
    from tfdist.compat.tf_startup_logs import import_tensorflow

    import_tensorflow()  # quietly: the bench's own output is its table
    recipe = recipe_lib.load(recipe_name)
    model = recipe.build_model(dict(recipe.DEFAULTS))
    forward, ignored = 0, set()
    for layer in model.layers:
        kind = type(layer).__name__
        if kind == "Dense":
            forward += 2 * layer.kernel.shape[0] * layer.kernel.shape[1]
        elif kind == "Conv2D":
            kh, kw, cin, cout = layer.kernel.shape
            _, h, w, _ = layer.output.shape
            forward += 2 * h * w * kh * kw * cin * cout
        elif layer.count_params() or kind not in ("InputLayer",):
            ignored.add(kind)
    params = parameters.count(model.trainable_variables)
    return {"params": params, "grad_bytes": params * 4, "forward_flops": int(forward),
            "train_flops_per_example": int(3 * forward), "ignored_layers": sorted(ignored)}
