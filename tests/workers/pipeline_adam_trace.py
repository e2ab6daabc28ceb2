"""Test worker (#43): a pipeline's gradients and weights against one process's, step by step.

    python tests/workers/pipeline_adam_trace.py OUT_DIR

model_parallel_mlp at 4 hidden layers of 256 units, Adam (lr 1e-3), global
batch 64, 40 steps on the recipe's data in tfdist.train's order, in one
process with 4 logical CPUs. Each step's gradients are read where Keras's
optimizer receives them (an Adam that keeps a copy of what it is given):

* one process (the reference), recording its weights before each step;
* forced: each split form trained one step from the reference's weights
  before that step, every step; its gradient is then one process's gradient
  computed another way, so any error shows however chaotic training is;
* free: each form trained from the same start for 40 steps (the usual
  equality test);
* the floor: one process again, from starting weights moved by one float32
  ulp (a seeded random direction per element), several seeds: how far
  rounding alone carries one process here;
* at the first step where a free run's gradient leaves one process's by more
  than rounding, the ReLU pre-activation that changed sign between the two runs.

Forms: pipeline (2 stages on CPU:0-1) at M = 2, 4, 8 under GPipe and 1F1B,
and 2 stages x 2-way tensor parallel (CPU:0-3, M = 2). Writes OUT_DIR/report.json.

The floor is measured by nudging one process, not by MirroredStrategy: here a
change of summation order is a lottery ticket (one of the 8 nudged runs ends
3.9e-2 away, the others within 1.1e-5), so one more order, TF's, says little.
"""

import json
import os
import sys

import numpy as np

STEPS, BATCH, LR, SEEDS = 40, 64, 1e-3, 8
HERE = os.path.dirname(os.path.abspath(__file__))
FORMS = {f"{s}{m}": dict(microbatches=m, schedule=s) for s in ("gpipe", "1f1b") for m in (2, 4, 8)}


def rel(a, b):
    """max |a - b| over max |a| (per tensor), the largest over tensors."""
    return max(float(np.max(np.abs(x - y)) / max(float(np.max(np.abs(x))), 1e-30))
               for x, y in zip(a, b))


def main():
    out_dir = sys.argv[1]
    from tfdist.strategies.devices import configure_runtime

    configure_runtime(cpu_devices=4)
    import keras
    import tensorflow as tf

    sys.path.insert(0, os.path.join(HERE, "..", "..", "recipes"))
    import model_parallel_mlp as recipe

    from tests.weights import ulp_nudged
    from tfdist import data
    from tfdist.model_parallel import pipeline, surgery, tensor_parallel

    cfg = dict(hidden_layers=4, hidden_units=256, test_fraction=0.2)
    batches = list(data.prepare(recipe.build_dataset(cfg, "train"), BATCH, repeat=True)
                   .take(STEPS).as_numpy_iterator())

    class CaptureAdam(keras.optimizers.Adam):
        """Adam that keeps the gradients of its last step."""

        def build(self, var_list):
            super().build(var_list)
            self.last = [self.add_variable_from_reference(v, "last_gradient") for v in var_list]

        def update_step(self, gradient, variable, learning_rate):
            self.last[self._get_variable_index(variable)].assign(tf.convert_to_tensor(gradient))
            return super().update_step(gradient, variable, learning_rate)

    def plain():
        keras.utils.set_random_seed(0)
        return recipe.build_model(cfg)

    def compiled(model):
        model.compile(optimizer=CaptureAdam(LR), **recipe.compile_kwargs(cfg))
        return model

    def sharded(model):
        return any(tensor_parallel.is_tensor_parallel(layer)
                   for layer in getattr(model, "inner", model).layers)

    def weights(model):  # the plain model's weights (tensor-parallel shards gathered)
        inner = getattr(model, "inner", model)
        return (surgery.gather_model(inner) if sharded(model) else inner).get_weights()

    def set_weights(model, ws):
        inner = getattr(model, "inner", model)
        if sharded(model):
            source = plain()
            source.set_weights(ws)
            surgery.copy_weights(source, inner)
        else:
            inner.set_weights(ws)

    def gradients(model):
        if sharded(model):  # shards' gradients: compared through the weights only
            return None
        return [np.array(v) for v in model.optimizer.last]

    def run(model, start=None, force=None):
        """Steps over `batches` from a fresh optimizer (one model, traced once, serves
        several runs); returns (weights before each step, each step's gradients)."""
        opt = model.optimizer
        for v in opt.variables if opt.built else ():  # the step count and the slots
            if v is not opt._learning_rate:
                v.assign(tf.zeros_like(v))
        if start is not None:
            set_weights(model, start)
        before, grads = [], []
        for t, (x, y) in enumerate(batches):
            if force is not None:
                set_weights(model, force[t])
            before.append(weights(model))
            model.train_on_batch(x, y)
            grads.append(gradients(model))
        return before + [weights(model)], grads

    def form(name):
        if name == "tp2":
            return compiled(pipeline.split(plain(), [f"/cpu:{i}" for i in range(4)],
                                           microbatches=2, tensor_parallel=2))
        return compiled(pipeline.split(plain(), ["/cpu:0", "/cpu:1"], **FORMS[name]))

    one = compiled(plain())
    ref_w, ref_g = run(one)
    init = ref_w[0]
    report = {"moved": rel(ref_w[-1], init), "forms": {}}
    for name in [*FORMS, "tp2"]:
        model = form(name)
        forced_w, forced_g = run(model, force=ref_w[:-1])
        free_w, free_g = run(model, start=init)
        entry = {"free": rel(ref_w[-1], free_w[-1]),
                 "forced_weights": max(rel(a, b) for a, b in zip(ref_w[:-1], forced_w[:-1]))}
        if forced_g[0] is not None:
            entry["forced"] = max(rel(a, b) for a, b in zip(ref_g, forced_g))
            steps = [rel(a, b) for a, b in zip(ref_g, free_g)]
            entry["free_gradients"] = steps
            jump = next((t for t, d in enumerate(steps) if d > 1e-4), None)
            if jump is not None:
                entry["jump"] = dict(step=jump + 1, gradient=steps[jump],
                                     weights_before=rel(ref_w[jump], free_w[jump]),
                                     flips=sign_flips(ref_w[jump], free_w[jump],
                                                      batches[jump][0]))
        report["forms"][name] = entry

    rng = np.random.default_rng(0)
    floor = []
    for _ in range(SEEDS):
        floor_w, _ = run(one, start=ulp_nudged(init, rng))
        floor.append(rel(ref_w[-1], floor_w[-1]))
    report["ulp_floor"] = floor
    json.dump(report, open(os.path.join(out_dir, "report.json"), "w"), indent=1)


def sign_flips(wa, wb, x):
    """ReLU pre-activations of batch `x` whose sign differs between weights `wa` and `wb`."""
    flips = []
    ha, hb = x.astype(np.float32), x.astype(np.float32)
    for layer in range(len(wa) // 2 - 1):
        za = ha @ wa[2 * layer] + wa[2 * layer + 1]
        zb = hb @ wb[2 * layer] + wb[2 * layer + 1]
        for row, unit in np.argwhere((za > 0) != (zb > 0)):
            flips.append(dict(layer=f"hidden_{layer}", row=int(row), unit=int(unit),
                              one_process=float(za[row, unit]), split=float(zb[row, unit])))
        ha, hb = np.maximum(za, 0), np.maximum(zb, 0)
    return flips


if __name__ == "__main__":
    main()
