"""`python -m tfdist.bench.plan_worker ROWS P M V HOP_MS RECIPE [--key value ...]`: the planner's pass.

Builds RECIPE's model (as `tfdist.train` would, no training), measures each
layer call on one micro-batch of ROWS rows with one intra-op thread
(`model_parallel.profile`), cuts it as each schedule would on P stages
(`graph.balanced_cuts`: P chunks, P·V interleaved) and prints one result
line (`runs.emit`) with each schedule's prediction (`planner.predict`,
HOP_MS added per hand-off between stages) and the layers' costs.
"""

from __future__ import annotations

import dataclasses
import sys


def main(argv: list[str]) -> int:
    """Measures, predicts, prints one result line."""
    rows, p, m, v, hop_ms, *rest = argv
    rows, p, m, v, hop_ms = int(rows), int(p), int(m), int(v), float(hop_ms)
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    from tfdist import recipe as recipe_lib
    from tfdist import train
    from tfdist.bench import runs
    from tfdist.model_parallel import graph as graph_lib
    from tfdist.model_parallel import planner, profile, schedules

    recipe, cfg = train.parse(rest)
    model = recipe_lib.build_model(recipe, cfg)
    rng = np.random.default_rng(0)
    inputs = [rng.normal(size=(rows, *t.shape[1:])).astype(t.dtype) if "float" in str(t.dtype)
              else np.zeros((rows, *t.shape[1:]), t.dtype) for t in model.inputs]
    costs = profile.layer_costs(model, inputs)
    graph = graph_lib.from_keras(model)
    predictions = {}
    for name in ("gpipe", "1f1b", "interleaved", "zb"):
        chunks = schedules.chunks(name, p, v)
        bounds = [0, *graph_lib.balanced_cuts(graph, chunks), len(graph.nodes)]
        predictions[name] = {"bounds": bounds, **planner.predict(
            name, costs, bounds, p, m, v if name == "interleaved" else 1, hop_ms / 1e3)}
    runs.emit({"layers": [dataclasses.asdict(c) for c in costs], "predictions": predictions,
               "choice": planner.choose(predictions)})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
