"""`pipeline`: pipeline (GPipe) vs naive model parallelism, and the measured bubble.

One process, the CPU split into p logical devices, a chain MLP split evenly
into p stages. For each micro-batch count M it times the full training step
(T), and each stage alone doing the same M micro-batches forward and backward
on its device (its busy time B_s). The measured bubble is 1 - mean(B_s) / T,
reported beside GPipe's (p - 1) / (M + p - 1). M = 1 is naive model
parallelism. Logical CPU devices share the host's cores, so overlap between
stages needs at least p cores free; on a shared machine the figures move.
"""

from __future__ import annotations

import time

from tfdist.model_parallel import plan

DESCRIPTION = "pipeline vs naive model parallel: throughput, measured vs theoretical bubble"


def add_arguments(parser):
    """Flags of this benchmark."""
    parser.add_argument("--devices", type=int, default=2, help="stages p (logical devices)")
    parser.add_argument("--microbatches", default="1,2,4,8", help="comma-separated M values")
    parser.add_argument("--layers", type=int, default=4, help="Dense layers (split evenly)")
    parser.add_argument("--width", type=int, default=1024, help="units per Dense layer")
    parser.add_argument("--batch", type=int, default=256, help="examples per step")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per point")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per op")


def _time(fn, args, warmup, steps):
    for _ in range(warmup):
        fn(*args)
    start = time.perf_counter()
    for _ in range(steps):
        out = fn(*args)
    _ = [o.numpy() for o in (out if isinstance(out, (list, tuple)) else [out])]
    return (time.perf_counter() - start) / steps


def _stage_alone(tf, model, s, variables):
    """A tf.function: stage `s` forward and backward for each micro-batch in `hs`, on its device.

    A closure, not default arguments: tf.function would turn those into placeholders.
    """

    def alone(hs):
        sums = []
        for i in range(hs.shape[0]):
            h = hs[i]
            with tf.device(model.stage_devices[s]):
                with tf.GradientTape() as tape:
                    tape.watch(h)
                    out = model.run_stage(s, h, training=True)
                g = tape.gradient(out, [h, *variables], output_gradients=tf.ones_like(out))
                sums.append(tf.add_n([tf.reduce_sum(t) for t in g]))
        return tf.add_n(sums)

    return tf.function(alone, autograph=False)


def run(args) -> dict:
    """Measures every M; returns the JSON-able result."""
    from tfdist.strategies.devices import configure_runtime

    ms = [int(m) for m in args.microbatches.split(",")]
    for m in ms:
        plan.microbatch_size(args.batch, m)
    configure_runtime(cpu_devices=args.devices, intra_op_threads=args.threads,
                      inter_op_threads=args.devices + 1)
    import keras
    import numpy as np
    import tensorflow as tf

    from tfdist.model_parallel import pipeline
    from tfdist.strategies.devices import local_devices

    devices = local_devices(args.devices)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(args.batch, args.width)).astype("float32"))
    y = tf.constant(rng.integers(0, 10, args.batch).astype("int32"))

    def chain():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((args.width,))
        h = inputs
        for k in range(args.layers - 1):
            h = keras.layers.Dense(args.width, activation="relu", name=f"d{k}")(h)
        return keras.Model(inputs, keras.layers.Dense(10, name="out")(h))

    points = []
    for m in ms:
        model = pipeline.split(chain(), devices, microbatches=m)
        model.compile(optimizer=keras.optimizers.SGD(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.optimizer.build(model.trainable_variables)
        step = tf.function(lambda a, b, model=model: model.train_step((a, b))["loss"])
        step_s = _time(step, (x, y), args.warmup, args.steps)
        busy = []
        for s in range(len(model.stage_sizes)):
            # Every stage's input is args.width wide (the input and each hidden layer).
            micro = tf.constant(
                rng.normal(size=(m, args.batch // m, args.width)).astype("float32"))
            variables = [v for layer in model.stage(s) for v in layer.trainable_weights]

            alone = _stage_alone(tf, model, s, variables)

            busy.append(_time(alone, (micro,), args.warmup, args.steps))
        p = len(model.stage_sizes)
        points.append({"microbatches": m, "stages": p, "step_s": step_s,
                       "examples_per_s": args.batch / step_s, "stage_busy_s": busy,
                       "bubble_measured": plan.measured_bubble(step_s, busy),
                       "bubble_theory": plan.bubble_fraction(p, m)})
    naive = next((pt["examples_per_s"] for pt in points if pt["microbatches"] == 1), None)
    for pt in points:
        pt["speedup_vs_naive"] = pt["examples_per_s"] / naive if naive else None
    return {"config": {k: getattr(args, k) for k in ("devices", "microbatches", "layers", "width",
                                                     "batch", "steps", "warmup", "threads")},
            "points": points,
            "note": "M=1 is naive model parallelism; logical CPU devices share the host's cores."}


def table(result) -> str:
    """One row per micro-batch count."""
    from tfdist.bench.report import format_table

    rows = [[pt["microbatches"], pt["stages"], pt["step_s"] * 1e3, pt["examples_per_s"],
             pt["speedup_vs_naive"] or 0.0, pt["bubble_measured"], pt["bubble_theory"]]
            for pt in result["points"]]
    return format_table(["M", "p", "step ms", "examples/s", "vs naive", "bubble meas.",
                         "bubble (p-1)/(m+p-1)"], rows)


def plot(result, fig):
    """Throughput and bubble against M."""
    pts = result["points"]
    ms = [pt["microbatches"] for pt in pts]
    ax1, ax2 = fig.subplots(1, 2)
    ax1.plot(ms, [pt["examples_per_s"] for pt in pts], "o-", label="pipeline (M=1: naive)")
    ax1.set_xlabel("micro-batches M")
    ax1.set_ylabel("examples/s")
    ax1.set_xscale("log", base=2)
    ax1.set_title("throughput")
    ax1.legend()
    ax2.plot(ms, [pt["bubble_measured"] for pt in pts], "o-", label="measured 1 - busy/step")
    ax2.plot(ms, [pt["bubble_theory"] for pt in pts], "s--", label="(p-1)/(m+p-1)")
    ax2.set_xlabel("micro-batches M")
    ax2.set_ylabel("idle fraction")
    ax2.set_xscale("log", base=2)
    ax2.set_title(f"bubble, p={pts[0]['stages'] if pts else '?'}")
    ax2.legend()
