"""`model_parallel`: the model's layers split over local devices, one stage at a time.

Naive model parallelism: contiguous layer groups on devices (an even split over
`--devices`, or `--placement 'a,b=/cpu:0;c=/cpu:1'`), variables and compute
(forward and backward) of each group on its device. Only one device works at
a time; `pipeline` overlaps them with micro-batches. One process, one replica.
`--tensor-parallel T` gives each group T devices, its attention split by heads
and its feed-forward pairs by units (`--devices 2 --tensor-parallel 2`: pure
2-way tensor parallelism, one stage).
"""

from __future__ import annotations

from tfdist.errors import ConfigError
from tfdist.strategies import Adapter, Hooks, register


def build(cluster, options):
    """The default strategy (one replica); the split happens in `transform_model`.

    Raises:
        ConfigError: on a multi-worker cluster (model parallelism here is one process).
    """
    import tensorflow as tf

    if cluster is not None and cluster.is_multi_worker:
        raise ConfigError(f"Model and pipeline parallelism run in one process; this job has "
                          f"{cluster.num_workers} workers (from {cluster.source}). Run one "
                          f"process and split the model over its --devices.")
    return tf.distribute.get_strategy()


def transform_model(model, options, microbatches: int = 1, schedule: str = "gpipe",
                    devices: list[str] | None = None, copies: int = 1,
                    global_batch_size: int = 0, node_costs: list[int] | None = None):
    """Splits `model` into placed stages and prints the placement table.

    Args:
        model: The recipe's built (uncompiled) functional or Sequential Keras model.
        options: StrategyOptions (devices, placement, tensor_parallel).
        microbatches: Micro-batches per batch (1: naive model parallelism).
        schedule: The pipeline schedule ("gpipe" or "1f1b").
        devices: The stages' devices; None: `options.devices` local ones (or the placement's).
        copies: Data-parallel copies of the pipeline over `devices` (copy-major).
        global_batch_size: Not read here (the pipeline's planner sizes its
            micro-batch from it; the hooks pass it to either).
        node_costs: Each layer call's weight for the cuts (`--balance time`);
            None: its parameters.

    Returns:
        A `tfdist.model_parallel.pipeline_model.PipelineModel` with `model`'s weights.
    """
    from tfdist.model_parallel import pipeline, placement, plan
    from tfdist.strategies.devices import local_devices

    if devices is None and not options.placement:
        devices = local_devices(options.devices)
    split = pipeline.split(model, devices, options.placement, microbatches, schedule,
                           options.tensor_parallel, copies, options.virtual_stages,
                           node_costs)
    table = plan.format_placement(placement.placement_rows(split.pipeline_layers))
    tensor = (f", {options.tensor_parallel}-way tensor parallel in each"
              if options.tensor_parallel > 1 else "")
    print(f"tfdist: placement of {model.name!r} over {len(split.stage_devices)} stage(s){tensor}, "
          f"{microbatches} micro-batch(es) per batch\n{table}", flush=True)
    for c in range(1, getattr(split, "num_copies", 1)):
        held = sorted({placement.short_name(v.value.device) for v in split._copies[c].weights})
        print(f"tfdist: data-parallel copy {c} of the stages: {', '.join(held)}", flush=True)
    return split


class ModelParallelHooks(Hooks):
    """Trainer hooks: the model is split after the recipe builds it."""

    def __init__(self, options, transform):
        self.options, self._transform = options, transform

    def transform_model(self, model, global_batch_size=0):
        return self._transform(model, self.options, global_batch_size=global_batch_size)

    def callbacks(self, learning_rate, warmup_epochs=0.0, global_batch_size=0):
        """The memory each process will hold, printed before the first step."""
        from tfdist.model_parallel.planning import memory_plan

        copies = getattr(self, "copies", 1)
        rows = global_batch_size // (copies * self.options.microbatches)
        return [memory_plan.callback(rows)] if rows else []


@register
class ModelParallel(Adapter):
    """The model's layers split over local devices (naive model parallelism, M = 1)."""

    name = "model_parallel"
    accepts = ("devices", "placement", "tensor_parallel")
    one_process = True
    portable = True  # the same math as one device: a backup resumes split another way

    @classmethod
    def check_config(cls, settings, cluster):
        super().check_config(settings, cluster)
        from tfdist.model_parallel import plan

        options = settings.adapter
        plan.microbatch_size(settings.training.global_batch_size, options.microbatches)
        plan.check_tensor_parallel(options.devices, options.tensor_parallel,
                                   bool(options.placement))
        if options.placement:
            plan.parse_placement(options.placement)

    def build(self):
        return build(self.cluster, self.options)

    def hooks(self) -> Hooks:
        return ModelParallelHooks(self.options, transform_model)
