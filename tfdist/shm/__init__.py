"""Shared-memory data parallelism for processes on one host (`--strategy shm`).

The fastest gradient all-reduce tfdist offers on one machine: every rank's
training thread reduces its share of each gradient straight through a shared
memory segment (`Communicator`), with no gRPC ring (MultiWorkerMirrored) and
no engine thread (Horovod) competing for the cores. The API mirrors
`tfdist.horovod`:

    from tfdist import shm
    comm = shm.init(rank, size, ("127.0.0.1", port))   # once per process
    optimizer = shm.DistributedOptimizer(keras.optimizers.SGD(0.1))
    model.compile(optimizer=optimizer, loss=..., jit_compile=False)
    model.fit(..., callbacks=[shm.BroadcastInitialState(), shm.MetricAverage()])

`python -m tfdist.launch -n N -- python -m tfdist.train RECIPE --strategy shm`
does all of this from the cluster (TF_CONFIG or Slurm) on one host.
"""

import importlib

# Lazy, so that `tfdist.shm.comm` (numpy only) imports without TensorFlow.
_EXPORTS = {
    "BroadcastInitialState": "tfdist.shm.callbacks", "MetricAverage": "tfdist.shm.callbacks",
    "broadcast_state": "tfdist.shm.callbacks", "Communicator": "tfdist.shm.comm",
    "DistributedOptimizer": "tfdist.shm.ops", "allreduce": "tfdist.shm.ops",
    "communicator": "tfdist.shm.runtime", "init": "tfdist.shm.runtime",
    "init_from_cluster": "tfdist.shm.runtime", "shutdown": "tfdist.shm.runtime",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'tfdist.shm' has no attribute {name!r}")
