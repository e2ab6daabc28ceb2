"""`pipeline`: model-parallel stages fed with micro-batches (GPipe or 1F1B schedule).

Like `model_parallel`, with each batch split into `--microbatches M` equal
micro-batches that flow through the stages so that devices overlap; gradients
are summed over the micro-batches and applied once per batch. The idle
fraction of each step is about (p - 1) / (M + p - 1) for p balanced stages;
`python -m tfdist.bench pipeline` measures it.
"""

from __future__ import annotations

from tfdist.strategies import model_parallel, register


def build(cluster, options):
    """The default strategy (one replica); see `model_parallel.build`."""
    return model_parallel.build(cluster, options)


def transform_model(model, options):
    """Splits `model` into stages trained with `options.microbatches` micro-batches."""
    from tfdist.model_parallel import plan

    split = model_parallel.transform_model(model, options, options.microbatches,
                                           options.schedule)
    p = len(split.stage_devices)
    print(f"tfdist: pipeline p={p} m={options.microbatches} schedule={options.schedule} "
          f"theoretical bubble {plan.bubble_fraction(p, options.microbatches):.3f}", flush=True)
    return split


@register
class Pipeline(model_parallel.ModelParallel):
    """Model-parallel stages fed with micro-batches."""

    name = "pipeline"
    accepts = ("devices", "placement", "microbatches", "schedule", "tensor_parallel")

    def hooks(self):
        return model_parallel.ModelParallelHooks(self.options, transform_model)
