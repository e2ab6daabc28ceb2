"""A deliberately slow worker, to compare synchronous and asynchronous training.

A benchmark knob, registered as a `tfdist.instruments.Instrument` when this
module is imported (`python -m tfdist.train` and the benchmarks do):
`--straggler-delay-ms D --straggler-worker I` makes training worker I sleep D
ms at the start of each of its steps, like a slower or busier machine; the
other workers run at full speed. Synchronous training waits for it at every
all-reduce; asynchronous (parameter-server) training does not.

The sleep does not burn CPU (this project's machines share 2 cores), so the
other workers really are unaffected.
"""

from __future__ import annotations

from tfdist import instruments
from tfdist.errors import ConfigError
from tfdist.option import Option


def check(delay_ms: int, worker: int, num_workers: int) -> None:
    """Raises ConfigError for a negative delay or a worker index out of range."""
    if delay_ms < 0:
        raise ConfigError(f"--straggler-delay-ms must be >= 0. Received: {delay_ms}.")
    if delay_ms and not 0 <= worker < num_workers:
        raise ConfigError(f"--straggler-worker must be in [0, {num_workers}) for a job with "
                          f"{num_workers} training worker(s). Received: {worker}.")


def keras_callback(delay_ms: int):
    """A Keras callback sleeping `delay_ms` before every training batch (sync `fit`)."""
    import time

    import keras

    class Straggler(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            time.sleep(delay_ms / 1000.0)

    return Straggler()


def sleep_op(delay_ms):
    """Graph op sleeping `delay_ms` (a scalar int tensor) on whichever task runs it.

    For functions that run on remote workers, where Python `time.sleep` would
    run on the coordinator instead. tf.data's sleep transformation waits
    without using CPU; the raw op is the public handle to it.

    Returns:
        A scalar tensor to use as a control dependency.
    """
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64))
    slept = tf.raw_ops.SleepDataset(
        input_dataset=tf.data.experimental.to_variant(ds),
        sleep_microseconds=tf.cast(delay_ms, tf.int64) * 1000,
        output_types=[tf.int64], output_shapes=[[]])
    # One read only: it sleeps before every read, end-of-sequence included.
    slept = tf.data.experimental.from_variant(slept, tf.TensorSpec([], tf.int64))
    return next(iter(slept))


class Straggler(instruments.Instrument):
    """`--straggler-delay-ms D --straggler-worker I`: worker I sleeps D ms per step."""

    options = {
        "straggler_delay_ms": Option(0, "benchmarks: one worker sleeps this long in every step",
                                     ge=0, le=3_600_000, name="straggler_delay_ms"),
        "straggler_worker": Option(0, "benchmarks: which training worker sleeps (its index "
                                   "among the workers)", ge=0, name="straggler_worker"),
    }

    def check(self, opts, num_workers):
        check(opts.straggler_delay_ms, opts.straggler_worker, num_workers)

    def fit_callbacks(self, opts, cluster):
        if opts.straggler_delay_ms and cluster.worker_index == opts.straggler_worker:
            return [keras_callback(opts.straggler_delay_ms)]
        return []

    def step_deps(self, opts, worker_index):
        if not opts.straggler_delay_ms:
            return []
        import tensorflow as tf

        return [sleep_op(tf.where(worker_index == opts.straggler_worker,
                                  opts.straggler_delay_ms, 0))]

    def line_fields(self, opts):
        return {"straggler": f"{opts.straggler_delay_ms}ms@worker{opts.straggler_worker}"}

    def describe(self, opts):
        return {"straggler": {"delay_ms": opts.straggler_delay_ms,
                              "worker": opts.straggler_worker}}


instruments.register(Straggler())
