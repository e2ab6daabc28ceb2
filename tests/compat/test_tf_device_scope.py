"""tensorflow#53671: placing only a layer's construction leaves its compute elsewhere.

A subprocess with 2 logical CPUs builds a Dense under tf.device("/cpu:1") and
traces a call made outside that scope: the kernel lives on CPU:1 but the
MatMul asks for no device (so it runs on the default one). A layer placed with
tfdist's `place_layer` has its MatMul on CPU:1 too.
"""

import json

import pytest

from tests.conftest import run_py, tail

pytestmark = pytest.mark.integration

SCRIPT = r"""
import json
from tfdist.strategies.devices import configure_runtime
configure_runtime(cpu_devices=2)
import keras, tensorflow as tf
from tfdist.compat.tf_device_scope import place_layer

def matmul_devices(layer):
    graph = tf.function(lambda x: layer(x)).get_concrete_function(tf.TensorSpec((8, 4))).graph
    return [op.device for op in graph.get_operations() if op.type == "MatMul"]

upstream = keras.layers.Dense(2)
with tf.device("/cpu:1"):
    upstream.build((None, 4))
fixed = place_layer(keras.layers.Dense(2), "/cpu:1")
fixed.build((None, 4))
print(json.dumps({"upstream_kernel": upstream.kernel.value.device,
                  "upstream_matmul": matmul_devices(upstream),
                  "fixed_kernel": fixed.kernel.value.device,
                  "fixed_matmul": matmul_devices(fixed)}))
"""


def test_construction_scope_does_not_place_compute_and_place_layer_does():
    proc = run_py(["-c", SCRIPT], timeout=120)
    assert proc.returncode == 0, tail(proc)
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    # The upstream behaviour: variables on CPU:1, compute not asked to be there.
    assert r["upstream_kernel"].endswith("CPU:1")
    assert r["upstream_matmul"] == [""]
    # The workaround: both on CPU:1.
    assert r["fixed_kernel"].endswith("CPU:1")
    assert r["fixed_matmul"] == ["/device:CPU:1"]
