"""Test worker: split vs unsplit training in one process with 4 logical CPUs.

    python tests/workers/mp_equality.py OUT_DIR

Trains the same chain MLP (same seed, same init, SGD, deterministic ops)
unsplit on the default device, as pipelines with M = 1, 4, 8 over CPU:0 and
CPU:1 (GPipe, and 1F1B at M = 4), and a tensor-parallel MLP block against its
unsplit Dense pair. Then a small attention model (causal self-attention with
biases, cross-attention without, a feed-forward Dense pair) trained with Adam
unsplit, 2-way tensor parallel (one stage over CPU:0-1) and 2 stages x 2-way
tensor parallel (CPU:0-1, CPU:2-3, 2 micro-batches). Writes
OUT_DIR/weights.npz and OUT_DIR/report.json (variable devices, the device of
every MatMul in a traced train step, save/reload checks) for the tests.
"""

import json
import os
import sys

import numpy as np

DEVICES = ["/cpu:0", "/cpu:1"]
NUDGED = 4


def main():
    out_dir = sys.argv[1]
    from tfdist.strategies.devices import configure_runtime

    configure_runtime(cpu_devices=4)
    import keras
    import tensorflow as tf

    from tfdist.model_parallel import pipeline, placement
    from tfdist.model_parallel import tensor_parallel as tp

    tf.config.experimental.enable_op_determinism()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 16)).astype("float32")
    y = rng.integers(0, 4, 256).astype("int32")

    def chain():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((16,))
        h = inputs
        for k in range(3):
            h = keras.layers.Dense(32, activation="relu", name=f"d{k}")(h)
        return keras.Model(inputs, keras.layers.Dense(4, name="out")(h), name="chain")

    def fit(model):
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=64, epochs=2, verbose=0, shuffle=False)
        return model

    arrays, report = {}, {}
    init = chain().get_weights()
    for i, w in enumerate(fit(chain()).get_weights()):
        arrays[f"unsplit_{i}"] = w
    for m in (1, 4, 8):
        split = fit(pipeline.split(chain(), DEVICES, microbatches=m))
        for i, w in enumerate(split.get_weights()):
            arrays[f"pipeline{m}_{i}"] = w
    for i, w in enumerate(fit(pipeline.split(chain(), DEVICES, microbatches=4,
                                             schedule="1f1b")).get_weights()):
        arrays[f"onefoneb4_{i}"] = w
    # 2 data-parallel copies of a 2-stage pipeline (copy 1 on /cpu:2 and /cpu:3).
    copies = fit(pipeline.split(chain(), ["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3"],
                                microbatches=2, copies=2))
    for i, w in enumerate(copies.get_weights()):
        arrays[f"copies2_{i}"] = w
    second = copies._copies[1]
    report["copy1_devices"] = sorted({v.value.device[-5:] for v in second.weights})
    report["copy1_max_diff"] = max(float(np.abs(a - b).max()) for a, b in
                                   zip(second.get_weights(), copies.get_weights()))
    for i, w in enumerate(init):
        arrays[f"init_{i}"] = w

    # Where things are: variables, and every MatMul (forward and backward) of a traced step.
    report["variables"] = {v.path: v.value.device for v in split.weights}
    report["stages"] = {layer.name: split.stage_devices[s]
                        for s in range(len(split.stage_sizes)) for layer in split.stage(s)}
    step = tf.function(split.train_step).get_concrete_function(
        (tf.TensorSpec((64, 16), tf.float32), tf.TensorSpec((64,), tf.int32)))
    report["matmuls"] = [(op.name, op.device) for op in step.graph.get_operations()
                         if op.type == "MatMul"]
    report["table"] = placement.placement_rows(split.pipeline_layers)

    # A split model saves as a plain model, reloads unsplit, and splits again.
    path = os.path.join(out_dir, "split.keras")
    split.save(path)
    loaded = keras.models.load_model(path)
    again = pipeline.split(loaded, DEVICES[::-1], microbatches=2)
    report["reloaded_class"] = type(loaded).__name__
    report["reloaded_equal"] = all(np.array_equal(a, b) for a, b in
                                   zip(loaded.get_weights(), split.get_weights()))
    report["resplit_equal"] = all(np.array_equal(a, b) for a, b in
                                  zip(again.get_weights(), split.get_weights()))
    report["resplit_variables"] = {v.path: v.value.device for v in again.weights}

    # Tensor parallelism: ParallelMLP vs Dense -> Dense from the same weights.
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16,))
    dense = keras.Model(inputs, keras.layers.Dense(4)(
        keras.layers.Dense(64, activation="relu")(inputs)))
    inputs = keras.Input((16,))
    block = tp.ParallelMLP(64, 4, DEVICES)
    tp_model = keras.Model(inputs, block(inputs))
    block.set_dense_weights(dense.get_weights())
    fit(dense), fit(tp_model)
    for i, (a, b) in enumerate(zip(block.dense_weights(), dense.get_weights())):
        arrays[f"tp_{i}"], arrays[f"dense_{i}"] = a, b
    report["tp_variables"] = {v.path: v.value.device for v in tp_model.weights}
    tp_path = os.path.join(out_dir, "tp.keras")
    tp_model.save(tp_path)
    tp_loaded = keras.models.load_model(tp_path)
    report["tp_reloaded_equal"] = all(np.array_equal(a, b) for a, b in zip(
        tp_loaded.layers[1].dense_weights(), block.dense_weights()))

    tensor_parallel_checks(out_dir, arrays, report)
    np.savez(os.path.join(out_dir, "weights.npz"), **arrays)
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=1)


def tensor_parallel_checks(out_dir, arrays, report):
    """Attention and feed-forward, unsplit vs tensor-parallel (1 and 2 stages), under Adam."""
    import keras
    import tensorflow as tf

    from tests.weights import ulp_nudged
    from tfdist.model_parallel import pipeline, placement, surgery

    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 6, 16)).astype("float32")
    ctx = rng.normal(size=(64, 5, 12)).astype("float32")
    y = rng.normal(size=(64, 6, 16)).astype("float32")

    def attention_model():
        keras.utils.set_random_seed(0)
        inputs, context = keras.Input((6, 16), name="x"), keras.Input((5, 12), name="ctx")
        h = keras.layers.LayerNormalization(name="norm")(inputs)
        h = keras.layers.MultiHeadAttention(4, 4, name="self_attn")(h, h, use_causal_mask=True)
        h = keras.layers.Add(name="self_add")([inputs, h])
        a = keras.layers.MultiHeadAttention(4, 4, value_dim=3, use_bias=False,
                                            name="cross_attn")(h, context)
        h = keras.layers.Add(name="cross_add")([h, a])
        f = keras.layers.Dense(32, activation="relu", name="ffn_in")(h)
        f = keras.layers.Dense(16, name="ffn_out")(f)
        out = keras.layers.Add(name="ffn_add")([h, f])
        return keras.Model([inputs, context], keras.layers.Dense(16, name="head")(out),
                           name="attention")

    def fit(model):
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        model.fit((x, ctx), y, batch_size=16, epochs=2, verbose=0, shuffle=False)
        return model

    plain = attention_model()
    for v in plain.weights:
        arrays[f"attn_init/{v.path}"] = v.numpy()
    one = pipeline.split(attention_model(), DEVICES[:2], tensor_parallel=2)
    two = pipeline.split(attention_model(), ["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3"],
                         microbatches=2, tensor_parallel=2)
    report["tp_forward_max_diff"] = max(
        float(np.abs(plain((x, ctx)) - split((x, ctx))).max()) for split in (one, two))
    report["tp_roles"] = surgery.feed_forward_pairs(plain)
    report["tp_layer_classes"] = {layer.name: type(layer).__name__ for layer in one.inner.layers}
    # Where the shards' variables live, and where a traced step's matrix products run.
    report["tp_shard_variables"] = {v.path: v.value.device for v in one.weights}
    report["pptp_shard_variables"] = {v.path: v.value.device for v in two.weights}
    report["pptp_table"] = placement.placement_rows(two.pipeline_layers)
    fit(plain), fit(one), fit(two)
    # The floor: the unsplit model again, its starting weights moved by one float32 ulp
    # (a seeded random direction per element); how far rounding alone carries it here.
    nudge = np.random.default_rng(0)
    for seed in range(NUDGED):
        nudged = attention_model()
        nudged.set_weights(ulp_nudged(nudged.get_weights(), nudge))
        for v in fit(nudged).weights:
            arrays[f"attn_nudged{seed}/{v.path}"] = v.numpy()
    step = tf.function(one.train_step).get_concrete_function(
        ((tf.TensorSpec((16, 6, 16), tf.float32), tf.TensorSpec((16, 5, 12), tf.float32)),
         tf.TensorSpec((16, 6, 16), tf.float32)))
    products = {"forward": {}, "backward": {}}
    for op in step.graph.get_operations():
        if op.type in ("MatMul", "BatchMatMulV2", "Einsum"):
            side = products["backward" if op.name.startswith("gradient_tape/") else "forward"]
            side[op.device[-5:]] = side.get(op.device[-5:], 0) + 1
    report["tp_products"] = products
    for name, model in (("attn_plain", plain), ("attn_tp", surgery.gather_model(one.inner)),
                        ("attn_pptp", surgery.gather_model(two.inner))):
        for v in model.weights:
            arrays[f"{name}/{v.path}"] = v.numpy()
    # Saved gathered: plain Keras layers, the gathered weights, the unsplit outputs.
    path = os.path.join(out_dir, "pptp.keras")
    two.save(path)
    loaded = keras.models.load_model(path)
    gathered = surgery.gather_model(two.inner)
    report["tp_saved_classes"] = sorted({type(layer).__module__.split(".")[0]
                                         for layer in loaded.layers})
    report["tp_saved_equal"] = all(np.array_equal(a, b) for a, b in zip(
        loaded.get_weights(), gathered.get_weights()))
    report["tp_saved_forward_max_diff"] = float(np.abs(loaded((x, ctx)) - two((x, ctx))).max())


if __name__ == "__main__":
    main()
