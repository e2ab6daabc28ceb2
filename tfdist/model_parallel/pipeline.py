"""Pipeline parallelism: a model cut into stages on devices, fed with micro-batches.

`split` cuts a functional (or Sequential) Keras model between layer calls
(`tfdist.model_parallel.graph`): evenly in parameters at the cuts
that cross the fewest tensors (between the blocks of a Transformer, residuals
and all; the encoder output crossing into each decoder stage), or where
`--placement` says. Layers without weights stay with the layer before them.

`PipelineModel` trains the stages: its `train_step` splits each batch into M
equal micro-batches and runs a schedule (`tfdist.model_parallel.schedules`:
GPipe, 1F1B, interleaved 1F1B or zero bubble), a list of forward and backward
actions per device, each under its stage's device with a tape of its own
(`output_gradients` carry the gradient back across a cut), each device's
actions in the schedule's order (control dependencies). Interleaved, the
model is cut into P·V chunks, chunk k on device k mod P, each a `Stage`;
zero bubble splits each backward into the input gradients (I) and the
weights' (W), `Stage.input_gradients` and `Stage.weight_gradients`. Each stage adds a micro-batch's gradients to its
running sum as its backward produces them (every schedule runs a stage's
backwards in micro-batch order, so the sum is in micro-batch order), and the
sums are applied once per batch. With M = 1 it is naive model parallelism
(one stage busy at a time), and each variable's update runs as soon as its
gradient exists (`update_order`), so a stage never holds all its gradients.

Equality with unsplit training: the loss of a batch is the mean of the equal
micro-batches' mean losses, so each micro-batch's loss is scaled by 1/M and
the summed gradients equal the full batch's.
"""

from __future__ import annotations

from tfdist.errors import ConfigError
from tfdist.model_parallel import graph as graph_lib
from tfdist.model_parallel import plan, schedules, surgery
from tfdist.model_parallel import stage as stage_lib


def _model_class():
    """The `PipelineModel` class (its module imports Keras and TensorFlow)."""
    from tfdist.model_parallel.pipeline_model import PipelineModel

    return PipelineModel


def split(model, devices: list[str] | None = None, placement: str = "", microbatches: int = 1,
          schedule: str = "gpipe", tensor_parallel: int = 1, copies: int = 1,
          virtual_stages: int = 1, node_costs: list[int] | None = None):
    """Cuts a model into placed stages trained with micro-batches, each maybe tensor-parallel.

    Args:
        model: A built functional or Sequential Keras model.
        devices: Devices for an even split (one stage each) at the cuts that
            cross the fewest tensors.
        placement: Instead of `devices`, "a,b=/cpu:0;c=/cpu:1": contiguous
            layer groups in model order, one stage per group. Layers without
            weights go with the layer before them in both cases.
        microbatches: M, micro-batches per batch; M = 1 is naive model parallelism.
        schedule: One of `schedules.NAMES` ("gpipe", "1f1b", "interleaved", "zb").
        tensor_parallel: T, devices per stage: stage s runs on
            devices[s*T:(s+1)*T] (so `devices` holds P*T for P stages), its
            attention layers split by heads and its feed-forward Dense pairs
            by units over them (`tensor_parallel`), its other layers on the
            first. T = 1: each stage on one device.
        copies: C, data-parallel copies of the pipeline: `devices` holds C
            groups of P*T (copy-major); each copy takes 1/C of every batch, the
            copies' gradients are summed before the one update (on copy 0),
            and every copy then takes copy 0's weights.
        virtual_stages: V, chunks each device holds under "interleaved": the
            model is cut into P·V chunks, chunk k on the device of k mod P.
        node_costs: What each layer call weighs when the cuts are balanced
            (`--balance time`: its measured time); None: its parameters. The
            cuts only move: the weights trained are the same.

    Returns:
        A `PipelineModel` (uncompiled) starting from `model`'s weights.

    Raises:
        ConfigError: for a model that cannot be cut, a bad placement, a missing device.
    """
    # The name and V, before any work (M against P: when the model is built, and
    # before TensorFlow starts in the strategy's check).
    schedules.build(schedule, 1, 1, virtual_stages)
    if virtual_stages > 1 and placement:
        raise ConfigError(f"--virtual-stages {virtual_stages} cuts the model evenly into "
                          "chunks; --placement names one group per stage. Drop one of them.")
    if copies > 1 and (placement or not devices or len(devices) % copies):
        raise ConfigError(f"{copies} copies of the pipeline need devices for each "
                          f"(copy-major) and no placement. Received: {len(devices or [])} "
                          f"device(s), placement {placement!r}.")
    per = len(devices or []) // max(copies, 1)
    first_devices = devices[:per] if copies > 1 else devices
    t = plan.check_tensor_parallel(len(first_devices or []), tensor_parallel, bool(placement))
    graph = graph_lib.from_keras(model)
    if placement:
        groups = plan.parse_placement(placement)
        cuts = graph_lib.stages_from_groups(graph, [names for _, names in groups])
        stage_groups = [(device,) for device, _ in groups]
    else:
        if not first_devices:
            raise ConfigError("Model parallelism needs devices: pass --devices N (at least 2) "
                              "or --placement 'layer_a=/cpu:0;layer_b=/cpu:1'.")
        stage_groups = _chunks(_groups(first_devices, t), virtual_stages)
        cuts = graph_lib.balanced_cuts(graph.weighed(node_costs) if node_costs else graph,
                                       len(stage_groups))
    bounds = (0, *cuts, len(graph.nodes))
    stage_of = {}
    for s, (a, b) in enumerate(zip(bounds, bounds[1:])):
        for node in graph.nodes[a:b]:
            if stage_of.setdefault(node.layer, s) != s:
                raise ConfigError(
                    f"Layer {node.layer!r} is called in stage {stage_of[node.layer]} and stage "
                    f"{s}; a shared layer's weights live on one device. Keep its calls in one "
                    "stage (--placement), or use a data-parallel strategy.")
    copy_groups = [stage_groups] + [_chunks(_groups(devices[c * per:(c + 1) * per], t),
                                            virtual_stages) for c in range(1, copies)]
    split_plan = stage_lib.SplitPlan(bounds, tuple(n.layer for n in graph.nodes),
                                     tuple(tuple(g) for g in copy_groups))
    clones = [surgery.placed_clone(model, {name: groups[s] for name, s in stage_of.items()},
                                   graph) for groups in split_plan.copy_groups]
    out = _model_class()(clones[0], split_plan, microbatches, schedule, copies=clones[1:],
                         virtual=virtual_stages, name=model.name)
    object.__setattr__(out, "plain_json", model.to_json())  # what the run's weights load into
    return out


def _chunks(groups, virtual):
    """Each of the P·V chunks' devices: chunk k on stage k mod P's."""
    return [groups[k % len(groups)] for k in range(len(groups) * virtual)]


def _groups(devices, t):
    """Each stage's tuple of T devices."""
    return [tuple(devices[s * t:(s + 1) * t]) for s in range(len(devices) // t)]
