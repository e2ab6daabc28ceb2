"""A pipeline stage: a contiguous run of a model's layer calls on its own device(s).

The counterpart of `torch.distributed.pipelining`'s `_PipelineStageBase`: a
`Stage` knows its layers, its trainable variables, its devices, the tensors
that cross into it and out of it, and runs its forward and its backward on
its own device (each forward under a tape of its own, so each backward is
computed where its forward ran, not on the client). `PipelineModel` holds one
list of stages per data-parallel copy and runs a schedule over them
(`tfdist.model_parallel.schedules`).

Under zero-bubble schedules a stage's backward comes in two halves
(`forward_split`, `input_gradients`, `weight_gradients`): each layer call
runs under a tape of its own, the input gradients are taken call by call
from the last back (keeping each call's output gradient), and the weight
gradients later from those, with the same ops as one tape's.

A `SplitPlan` is what `pipeline.split` decides and hands to the model: where
the cuts fall and the devices of each copy's stages (under interleaving a
device holds several non-adjacent chunks, each a `Stage`).
"""

from __future__ import annotations

import dataclasses


def add_gradients(a, b):
    """a + b for gradients: IndexedSlices (an Embedding's) are concatenated, not densified."""
    import tensorflow as tf

    if a is None or b is None:
        return b if a is None else a
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
        return tf.IndexedSlices(tf.concat([a.values, b.values], 0),
                                tf.concat([a.indices, b.indices], 0), dense_shape=a.dense_shape)
    return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)


@dataclasses.dataclass
class _Call:
    """One layer call of a split-backward forward: its tape, tensors and variables."""

    tape: object
    inputs: list  # (tensor id, value) of the floating inputs that need a gradient
    outputs: list  # (tensor id, value)
    variables: list
    given: list = dataclasses.field(default_factory=list)  # (output value, its gradient)


@dataclasses.dataclass(frozen=True)
class SplitPlan:
    """Where a model is cut and where its stages run.

    Attributes:
        bounds: Node positions [0, cut_1, ..., n] in `graph.from_keras` order;
            stage s runs the layer calls bounds[s]:bounds[s + 1].
        layers: The layer name of each node (checks that a copy has the same order).
        copy_groups: For each data-parallel copy, each stage's tuple of devices
            (one device, or T under tensor parallelism; a stage runs under the first).
            Under interleaving, P·V chunks: chunk k on the device of k mod P.
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
        # Layers whose weights only this stage trains may leave their weight
        # gradients to the step's end (batched_weight_grads).
        ours = {id(v) for v in self.variables}
        self._batchable = {id(layer) for layer in self.layers if layer.trainable_weights
                           and all(id(v) in ours for v in layer.trainable_weights)}

    def forward(self, values, training=None, batched=None):
        """Its layer calls on its device: its input tensors -> its output tensors.

        Args:
            values: Aligned with `inputs`.
            training: Passed to the layers that take it (None: their default).
            batched: A `batched_weight_grads.MicrobatchCalls`: the Dense calls it
                takes record their inputs and pre-activations, and `backward`
                leaves those layers' weight gradients to `batched_gradients`
                (None: every layer's weight gradients come from `backward`).

        Returns:
            A list aligned with `outputs`.
        """
        import tensorflow as tf
        from keras import tree

        known = dict(zip(self.inputs, values))
        with tf.device(self.device):
            for node in self._nodes:
                layer, args, kwargs = _call(node, known, training)
                if (batched is not None and id(layer) in self._batchable and len(args) == 1
                        and set(kwargs) <= {"training"} and batched.takes(layer, args[0])):
                    out = batched.call(layer, args[0])
                else:
                    out = layer(*args, **kwargs)
                for ref, value in zip(node.outputs, tree.flatten(out)):
                    known[id(ref)] = value
        return [known[i] for i in self.outputs]

    def backward(self, tape, inputs, targets, upstream, batched=None):
        """Its backward, from the tape of its forward.

        Args:
            tape: The `tf.GradientTape` its forward ran under (inputs watched).
            inputs: The tensors its forward took.
            targets: Its outputs, or (last stage) the scaled loss.
            upstream: The next stage's gradients for `targets` (None: last stage).
            batched: The `MicrobatchCalls` its forward recorded (None: none): their
                pre-activations' gradients are set on them, and their layers'
                weight gradients are left out (None) for `batched_gradients`.

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
        calls = batched.calls if batched is not None else []
        waiting = {id(v) for c in calls for v in c.layer.trainable_weights}
        now = [v for v in self.variables if id(v) not in waiting]
        g = tape.gradient(targets, [*floating, *now, *(c.z for c in calls)],
                          output_gradients=given)
        into = iter(g[:len(floating)])
        made = dict(zip((id(v) for v in now), g[len(floating):len(floating) + len(now)]))
        for c, dz in zip(calls, g[len(floating) + len(now):]):
            c.dz = dz
        into_inputs = [next(into) if (differentiable and t.dtype.is_floating) else None
                       for t in inputs]
        return [made.get(id(v)) for v in self.variables], into_inputs

    def batched_gradients(self, calls):
        """The weight gradients `backward` left out, over a step's `DenseCall`s.

        Args:
            calls: Every micro-batch's batched calls through this stage, in
                micro-batch order (their rows in the batch's order).

        Returns:
            Aligned with `variables`: a gradient where the calls give one, else None.
        """
        import tensorflow as tf

        from tfdist.model_parallel import batched_weight_grads

        layers = list({id(c.layer): c.layer for c in calls}.values())
        made = {}
        with tf.device(self.device):
            for layer in layers:
                made.update(batched_weight_grads.gradients(
                    layer, [c for c in calls if c.layer is layer]))
        return [made.get(id(v)) for v in self.variables]

    def forward_split(self, values, training=None):
        """`forward` with each layer call under a tape of its own (zero-bubble schedules).

        Returns:
            (outputs aligned with `outputs`, the calls' record for `input_gradients`).
        """
        import tensorflow as tf
        from keras import tree

        known = dict(zip(self.inputs, values))
        # The model's own inputs (maybe tokens) need no gradient; every later tensor may.
        needs = set(self.inputs) if self.index > 0 else set()
        ours = {id(v) for v in self.variables}
        calls = []
        with tf.device(self.device):
            for node in self._nodes:
                layer, args, kwargs = _call(node, known, training)
                ins = [(id(t), known[id(t)]) for t in dict.fromkeys(node.input_tensors)
                       if id(t) in needs and known[id(t)].dtype.is_floating]
                with tf.GradientTape(persistent=True) as tape:
                    tape.watch([v for _, v in ins])
                    out = tree.flatten(layer(*args, **kwargs))
                for ref, value in zip(node.outputs, out):
                    known[id(ref)] = value
                    needs.add(id(ref))
                calls.append(_Call(tape, ins, [(id(r), v) for r, v in zip(node.outputs, out)],
                                   [v for v in layer.trainable_weights if id(v) in ours]))
        return [known[i] for i in self.outputs], calls

    def input_gradients(self, calls, upstream):
        """The first half of a split backward: its inputs' gradients, call by call.

        Args:
            calls: `forward_split`'s record.
            upstream: Gradients aligned with `outputs` (None where none flows).

        Returns:
            (its inputs' gradients, None where none flows; the calls that
            `weight_gradients` takes, each holding its output gradients).
        """
        import tensorflow as tf

        grads = {i: g for i, g in zip(self.outputs, upstream) if g is not None}
        pending = []
        with tf.device(self.device):
            for call in reversed(calls):
                call.given = [(v, grads[i]) for i, v in call.outputs if i in grads]
                if not call.given:
                    continue
                targets, given = zip(*call.given)
                if call.inputs:
                    into = call.tape.gradient(list(targets), [v for _, v in call.inputs],
                                              output_gradients=list(given))
                    for (i, _), g in zip(call.inputs, into):
                        grads[i] = add_gradients(grads.get(i), g)
                pending.append(call)
        into_inputs = [grads.get(i) if self.index > 0 else None for i in self.inputs]
        return into_inputs, pending

    def weight_gradients(self, pending):
        """The second half: its variables' gradients from the calls' output gradients.

        Returns:
            Aligned with `variables`, None where none flows.
        """
        import tensorflow as tf

        sums = {id(v): None for v in self.variables}
        with tf.device(self.device):
            for call in pending:
                if call.variables:
                    targets, given = zip(*call.given)
                    made = call.tape.gradient(list(targets), call.variables,
                                              output_gradients=list(given))
                    for v, g in zip(call.variables, made):
                        sums[id(v)] = add_gradients(sums[id(v)], g)
        return [sums[id(v)] for v in self.variables]

    def assign_from(self, other) -> None:
        """Gives this stage's weights the values of `other`'s (the same stage of another copy)."""
        import tensorflow as tf

        with tf.device(self.device):
            for mine, theirs in zip((w for layer in self.layers for w in layer.weights),
                                    (w for layer in other.layers for w in layer.weights)):
                mine.assign(theirs)


def _call(node, known, training):
    """(layer, args, kwargs) of a Keras layer call, its inputs taken from `known` (tensor
    id -> value) and `training` passed to a layer that takes it (None: its default)."""
    args, kwargs = node.arguments.fill_in(known)
    layer = node.operation
    if training is not None and "training" in getattr(layer, "_call_context_args", {}):
        kwargs["training"] = training
    return layer, args, kwargs
