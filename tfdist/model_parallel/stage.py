"""A pipeline stage: a contiguous run of a model's layer calls on its own device(s).

The counterpart of `torch.distributed.pipelining`'s `_PipelineStageBase`: a
`Stage` knows its layers, its trainable variables, its devices, the tensors
that cross into it and out of it, and runs its forward and its backward on
its own device (each forward under a tape of its own, so each backward is
computed where its forward ran, not on the client). `PipelineModel` holds one
list of stages per data-parallel copy and runs a schedule over them
(`tfdist.model_parallel.schedules`).

A `SplitPlan` is what `pipeline.split` decides and hands to the model: where
the cuts fall and the devices of each copy's stages.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SplitPlan:
    """Where a model is cut and where its stages run.

    Attributes:
        bounds: Node positions [0, cut_1, ..., n] in `graph.from_keras` order;
            stage s runs the layer calls bounds[s]:bounds[s + 1].
        layers: The layer name of each node (checks that a copy has the same order).
        copy_groups: For each data-parallel copy, each stage's tuple of devices
            (one device, or T under tensor parallelism; a stage runs under the first).
    """

    bounds: tuple
    layers: tuple
    copy_groups: tuple

    @property
    def num_stages(self) -> int:
        """P, stages per copy."""
        return len(self.bounds) - 1

    def stage_of(self) -> dict[str, int]:
        """layer name -> its stage."""
        return {name: s for s in range(self.num_stages)
                for name in self.layers[self.bounds[s]:self.bounds[s + 1]]}


class Stage:
    """Stage `index` of one copy of a pipeline.

    Attributes:
        index: s, its position in the pipeline.
        last: Whether it is the pipeline's last stage (it hands on the model's outputs).
        devices: Its devices (a tuple; more than one under tensor parallelism).
        device: The device its ops run under (the first).
        layers: Its layers, each once, in call order.
        variables: Its layers' trainable variables (the ones the model trains).
        inputs: Ids of the tensors it takes (the tensors crossing its first cut).
        outputs: Ids of the tensors it hands on (the next cut's, or the model's outputs).
    """

    def __init__(self, index, graph, keras_nodes, bounds, model, devices):
        a, b = bounds[index], bounds[index + 1]
        self.index, self.last = index, index + 1 == len(bounds) - 1
        self.devices = (devices,) if isinstance(devices, str) else tuple(devices)
        self.device = self.devices[0]
        by_name = {layer.name: layer for layer in model.layers}
        self.layers = list(dict.fromkeys(by_name[n.layer] for n in graph.nodes[a:b]))
        trained = {id(v) for v in model.trainable_variables}
        self.variables = [v for layer in self.layers for v in layer.trainable_weights
                          if id(v) in trained]
        self.inputs = graph.crossing(a)
        self.outputs = list(graph.outputs) if self.last else graph.crossing(b)
        self._nodes = keras_nodes[a:b]

    def forward(self, values, training=None):
        """Its layer calls on its device: its input tensors -> its output tensors.

        Args:
            values: Aligned with `inputs`.
            training: Passed to the layers that take it (None: their default).

        Returns:
            A list aligned with `outputs`.
        """
        import tensorflow as tf
        from keras import tree

        known = dict(zip(self.inputs, values))
        with tf.device(self.device):
            for node in self._nodes:
                args, kwargs = node.arguments.fill_in(known)
                layer = node.operation
                if training is not None and "training" in getattr(
                        layer, "_call_context_args", {}):
                    kwargs["training"] = training
                out = layer(*args, **kwargs)
                for ref, value in zip(node.outputs, tree.flatten(out)):
                    known[id(ref)] = value
        return [known[i] for i in self.outputs]

    def backward(self, tape, inputs, targets, upstream):
        """Its backward, from the tape of its forward.

        Args:
            tape: The `tf.GradientTape` its forward ran under (inputs watched).
            inputs: The tensors its forward took.
            targets: Its outputs, or (last stage) the scaled loss.
            upstream: The next stage's gradients for `targets` (None: last stage).

        Returns:
            (its variables' gradients, its inputs' gradients), None where none flows.
        """
        given = None
        if not self.last:  # the outputs a later stage sent a gradient for
            kept = [(t, g) for t, g in zip(targets, upstream or []) if g is not None]
            targets, given = [t for t, _ in kept], [g for _, g in kept]
        differentiable = self.index > 0  # the model's own inputs (maybe tokens) need none
        floating = [t for t in inputs if t.dtype.is_floating] if differentiable else []
        if not targets:
            return [None] * len(self.variables), [None] * len(inputs)
        g = tape.gradient(targets, [*floating, *self.variables], output_gradients=given)
        into, rest = iter(g[:len(floating)]), g[len(floating):]
        into_inputs = [next(into) if (differentiable and t.dtype.is_floating) else None
                       for t in inputs]
        return list(rest), into_inputs

    def assign_from(self, other) -> None:
        """Gives this stage's weights the values of `other`'s (the same stage of another copy)."""
        import tensorflow as tf

        with tf.device(self.device):
            for mine, theirs in zip((w for layer in self.layers for w in layer.weights),
                                    (w for layer in other.layers for w in layer.weights)):
                mine.assign(theirs)
