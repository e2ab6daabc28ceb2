"""`--bucket-mb` under multi_worker: TensorFlow's packs start during the backward pass (#31).

MultiWorkerMirrored's all-reduce is TensorFlow's `CollectiveAllReduce`: with
`CommunicationOptions(bytes_per_pack=B)` (what `--bucket-mb` sets) it
reverses the gradient list and launches one collective per pack, so the
first pack holds the last layers' gradients and needs nothing of the first
layer's. The same code serves a MirroredStrategy given that cross-device op,
which a subprocess with 2 logical CPUs traces here (graph only, not run):
with B = 0 one collective per replica waits for every gradient.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_py, tail

pytestmark = pytest.mark.integration

SCRIPT = r"""
import json
from tfdist.strategies.devices import configure_runtime
configure_runtime(cpu_devices=2)
import keras, tensorflow as tf
from tensorflow.python.distribute import cross_device_ops, collective_util
from tfdist.model_parallel.update_order import ancestors
from tfdist.strategies.multi_worker import communication_options

devices = ["/cpu:0", "/cpu:1"]
strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=(
    cross_device_ops.CollectiveAllReduce(devices, 2, collective_util.Options())))
with strategy.scope():
    model = keras.Sequential([keras.Input((64,))] + [
        keras.layers.Dense(64, use_bias=False) for _ in range(4)])

def trace(mb):
    names = []
    options = communication_options("ring", 10, mb)
    @tf.function
    def step(x):
        def replica(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(x))
            grads = tape.gradient(loss, model.trainable_variables)
            if not names:
                names.extend(g.op.name for g in grads)
            return tf.distribute.get_replica_context().all_reduce("sum", grads, options=options)
        return strategy.run(replica, (x,))
    graph = step.get_concrete_function(tf.TensorSpec([8, 64])).graph
    grads = [graph.get_operation_by_name(n) for n in names]  # replica 0's, layer order
    ops = [o for o in graph.get_operations()
           if o.type == "CollectiveReduceV2" and o.device.endswith("CPU:0")]
    return [[i for i, g in enumerate(grads) if g in ancestors([op])] for op in ops], \
        options.bytes_per_pack

print(json.dumps({"packs": trace(0.001 * 16), "one": trace(0)}))
"""


def test_packs_start_with_the_last_layers_gradients():
    proc = run_py(["-c", SCRIPT], timeout=120)
    assert proc.returncode == 0, tail(proc)
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    needs, bytes_per_pack = got["packs"]
    assert bytes_per_pack == 16777  # --bucket-mb 0.016: a pack closes past one 16 KB kernel
    # Replica 0's collectives in launch order, each with the gradients it waits for:
    # the first needs the last two layers' only, so it runs while the first two are made.
    assert needs[0] == [2, 3] and needs[-1] == [0, 1, 2, 3], needs
    needs, bytes_per_pack = got["one"]
    assert bytes_per_pack == 0 and needs == [[0, 1, 2, 3]]
