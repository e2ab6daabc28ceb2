"""The run pipeline: one run of a recipe, from its checked options to its model dir.

`trainer.train(recipe, cfg, cluster)` is the entry every command uses (the
CLI `tfdist.train`, the benchmarks' workers): it checks the options before
TensorFlow, inspects and claims the model dir (`run_dir`, through the
chief-only `writer.ChiefWriter`), then hands a `loop.Run` to the loop the
strategy adapter names: Keras `fit` on every training process
(`trainer.FitLoop`), the parameter-server coordinator (`coordinator`), or a
pipeline whose stages serve while the chief drives them (`trainer.StageLoop`).
Every loop starts TensorFlow, sets up the runtime and finishes (evaluation,
metrics.json, the chief's model save) through `loop`. `types` holds what a run
returns and raises.

Imports go down: this package asks the strategy adapters (`tfdist.strategies`)
and their engines; none of them imports it.
"""
