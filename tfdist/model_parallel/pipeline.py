"""Pipeline parallelism: stages on devices, GPipe micro-batches, one update per batch.

`PipelineModel` is a Keras model made of stages (lists of layers placed on one
device each). Its `train_step` splits each batch into M equal micro-batches,
runs every micro-batch forward through the stages, then backward in reverse,
each stage's forward and backward ops under its own device, and applies the
gradients summed over micro-batches once. Inside one `tf.function` the
micro-batches are independent dataflow, so stage s can work on micro-batch
i + 1 while stage s + 1 works on micro-batch i: that is the GPipe schedule,
with its (p - 1) / (m + p - 1) bubble. With M = 1 it is naive model
parallelism (one stage busy at a time).

Equality with unsplit training: the loss of a batch is the mean of the equal
micro-batches' mean losses, so each micro-batch's loss is scaled by 1/M and
the summed gradients equal the full batch's.
"""

from __future__ import annotations

import functools

from tfdist.model_parallel import placement as placement_lib
from tfdist.model_parallel import plan


@functools.lru_cache(maxsize=None)
def _model_class():
    import keras
    import tensorflow as tf

    class PipelineModel(keras.Model):
        """Stages of placed layers trained with a GPipe schedule.

        Args:
            stages: [(device, [layers])] in order; layers already placed and built
                (see `split`).
            microbatches: Micro-batches per batch (M); the batch must divide by it.
        """

        def __init__(self, stages, microbatches=1, input_shape=None, **kwargs):
            super().__init__(**kwargs)
            plan.microbatch_size(int(microbatches), 1)  # validates microbatches >= 1
            self.microbatches = int(microbatches)
            self.stage_devices = [d for d, _ in stages]
            # A flat list tracks the layers (and orders the weights as the unsplit model does).
            self.pipeline_layers = [layer for _, layers in stages for layer in layers]
            self.stage_sizes = [len(layers) for _, layers in stages]
            self.pipeline_input_shape = tuple(input_shape)
            self.built = True

        def stage(self, s):
            """The layers of stage `s`."""
            start = sum(self.stage_sizes[:s])
            return self.pipeline_layers[start:start + self.stage_sizes[s]]

        def run_stage(self, s, h, training=None):
            """Stage `s` forward on its device."""
            with tf.device(self.stage_devices[s]):
                for layer in self.stage(s):
                    h = layer(h, training=training)
            return h

        def call(self, x, training=None):
            for s in range(len(self.stage_sizes)):
                x = self.run_stage(s, x, training=training)
            return x

        def train_step(self, data):
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
            m, p = self.microbatches, len(self.stage_sizes)
            xs, ys = tf.split(x, m), tf.split(y, m)
            sws = tf.split(sample_weight, m) if sample_weight is not None else [None] * m
            variables = [[v for layer in self.stage(s) for v in layer.trainable_weights]
                         for s in range(p)]
            # Forward: every micro-batch through every stage, one tape per (micro-batch, stage).
            tapes = [[None] * p for _ in range(m)]
            ins = [[None] * p for _ in range(m)]
            outs = [[None] * p for _ in range(m)]
            losses, preds = [None] * m, [None] * m
            for i in range(m):
                h = xs[i]
                for s in range(p):
                    with tf.device(self.stage_devices[s]), tf.GradientTape() as tape:
                        if s > 0:  # the model's input (maybe integer tokens) needs no gradient
                            tape.watch(h)
                        out = self.run_stage(s, h, training=True)
                        if s == p - 1:
                            losses[i] = self._compute_loss(x=xs[i], y=ys[i], y_pred=out,
                                                           sample_weight=sws[i], training=True)
                            out_target = losses[i] / m  # mean of equal micro-batch means
                            preds[i] = out
                    tapes[i][s], ins[i][s] = tape, h
                    outs[i][s] = out_target if s == p - 1 else out
                    h = out
            # Backward: stages in reverse, each on its device; gradients summed over micro-batches.
            grads = [None] * p
            for i in range(m):
                upstream = None
                for s in reversed(range(p)):
                    with tf.device(self.stage_devices[s]):
                        sources = variables[s] if s == 0 else [ins[i][s], *variables[s]]
                        g = tapes[i][s].gradient(outs[i][s], sources, output_gradients=upstream)
                        if s > 0:
                            upstream, g = g[0], g[1:]
                        grads[s] = list(g) if grads[s] is None else [
                            _add(a, b) for a, b in zip(grads[s], g)]
            self.optimizer.apply([g for gs in grads for g in gs],
                                 [v for vs in variables for v in vs])
            with tf.device(self.stage_devices[-1]):
                y_pred = tf.concat(preds, axis=0)
            self._loss_tracker.update_state(tf.add_n(losses) / m, sample_weight=tf.shape(x)[0])
            return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

        def save(self, filepath, *args, **kwargs):
            """Saves the stages' layers as one plain `keras.Sequential` (loads without tfdist)."""
            return self.unsplit().save(filepath, *args, **kwargs)

        def unsplit(self):
            """A plain Sequential model sharing these layers and variables."""
            return keras.Sequential([keras.Input(shape=self.pipeline_input_shape[1:]),
                                     *self.pipeline_layers], name=self.name)

    return PipelineModel


def _add(a, b):
    """a + b for gradients: IndexedSlices (an Embedding's) are concatenated, not densified."""
    import tensorflow as tf

    if a is None or b is None:
        return b if a is None else a
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
        return tf.IndexedSlices(tf.concat([a.values, b.values], 0),
                                tf.concat([a.indices, b.indices], 0), dense_shape=a.dense_shape)
    return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)


def split(model, devices: list[str] | None = None, placement: str = "", microbatches: int = 1):
    """Splits a chain model into placed stages trained with micro-batches.

    Args:
        model: A built Keras model whose layers form a chain (Sequential, or a
            functional model where each layer feeds the next).
        devices: Devices for an even split of the layers (one stage each).
        placement: Instead of `devices`, "a,b=/cpu:0;c=/cpu:1": contiguous
            layer groups in model order, one stage per group. Layers without
            weights go with their neighbours in both cases.
        microbatches: M, micro-batches per batch; M = 1 is naive model parallelism.

    Returns:
        A `PipelineModel` (uncompiled) starting from `model`'s weights.

    Raises:
        ConfigError: for a non-chain model, a bad placement, a missing device.
    """
    layers = placement_lib.chain_layers(model)
    groups = placement_lib.assign([layer.name for layer in layers], devices, placement,
                                  placement_lib.weightless_names(layers))
    stages = placement_lib.placed_stages(model, groups)
    return _model_class()(stages, microbatches, input_shape=model.inputs[0].shape,
                          name=model.name)


def pipeline_model_class():
    """The `PipelineModel` class (defined lazily, so importing this module needs no Keras)."""
    return _model_class()
