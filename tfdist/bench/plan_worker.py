"""`python -m tfdist.bench.plan_worker ROWS P M V HOP_MS RECIPE [--key value ...]`: the planner's pass.

Builds RECIPE's model (as `tfdist.train` would, no training), measures each
layer call on one micro-batch of ROWS rows with one intra-op thread
(`model_parallel.planning.profile`) and the fixed cost of one action
(`profile.action_s`), cuts it as each schedule would on P stages
(`graph.balanced_cuts`: P chunks, P·V interleaved) and prints one result
line (`runs.emit`) with each schedule's prediction (`planner.plan`,
HOP_MS added per hand-off between stages; each process's peak over this
process's RSS once TensorFlow, Keras and tfdist are imported, before the
model is built: what a stage task holds before its stage) and the layers'
costs.
"""

from __future__ import annotations

import dataclasses
import sys


def main(argv: list[str]) -> int:
    """Measures, predicts, prints one result line."""
    rows, p, m, v, hop_ms, *rest = argv
    rows, p, m, v, hop_ms = int(rows), int(p), int(m), int(v), float(hop_ms)
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    import keras  # noqa: F401  (in the baseline, as a stage task holds it)

    from tfdist import memory_limit
    from tfdist import recipe as recipe_lib
    from tfdist import train
    from tfdist.bench import runs
    from tfdist.model_parallel import graph as graph_lib
    from tfdist.model_parallel.planning import planner, profile

    tf.constant(0.0) + 1.0  # TensorFlow's runtime started, as in a stage task
    baseline = memory_limit.rss_bytes() or 0
    recipe, cfg = train.parse(rest)
    model = recipe_lib.build_model(recipe, cfg)
    costs = profile.layer_costs(model, profile.sample_inputs(model, rows))
    action = profile.action_s()
    graph = graph_lib.from_keras(model)
    predictions = planner.plan(
        costs, lambda chunks: [0, *graph_lib.balanced_cuts(graph, chunks), len(graph.nodes)],
        p, m, {"gpipe": 1, "1f1b": 1, "interleaved": v, "zb": 1}, hop_ms / 1e3,
        planner.state_factor(2, m), baseline, action)
    runs.emit({"layers": [dataclasses.asdict(c) for c in costs], "action_s": action,
               "predictions": predictions,
               "baseline_bytes": baseline, "choice": planner.choose(predictions)})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
