"""Host collectives over Horovod's core ops (`horovod.tensorflow`), on Keras 3."""

from __future__ import annotations

import numpy as np

from tfdist.collectives import HostCollectives

# Horovod broadcasts these dtypes only through a same-width signed type.
_BITCAST = {"uint32": "int32", "uint64": "int64"}


class HorovodCollectives(HostCollectives):
    """`HostCollectives` through Horovod (`hvd.broadcast`, `hvd.allreduce`).

    Horovod matches collectives across ranks by name, so every call names
    its ops by kind and position; its errors name no peer (`lost_peer` knows
    only a PeerLostError raised as such).
    """

    @staticmethod
    def _hvd():
        from tfdist.horovod import runtime

        return runtime.hvd()

    @property
    def rank(self) -> int:
        return self._hvd().rank()

    @property
    def size(self) -> int:
        return self._hvd().size()

    def broadcast_tensors(self, tensors, root: int = 0) -> list:
        """`broadcast` on tensors (kept on their device): the values of `root`."""
        import tensorflow as tf

        hvd = self._hvd()
        out = []
        for i, value in enumerate(tensors):
            value = tf.convert_to_tensor(value)
            dtype, wire = value.dtype, _BITCAST.get(value.dtype.name)
            if wire:
                value = tf.bitcast(value, wire)
            value = hvd.broadcast(value, root, name=_name("bcast", i, value),
                                  ignore_name_scope=True)
            out.append(tf.bitcast(value, dtype) if wire else value)
        return out

    def broadcast(self, arrays, root: int = 0) -> list:
        return [np.asarray(t.numpy()) for t in self.broadcast_tensors(
            [np.asarray(a) for a in arrays], root)]

    def average(self, arrays) -> list:
        import tensorflow as tf

        hvd = self._hvd()
        out = []
        for i, a in enumerate(arrays):
            value = tf.constant(np.asarray(a))
            out.append(np.asarray(hvd.allreduce(value, op=hvd.Average, name=_name("mean", i, value),
                                                ignore_name_scope=True).numpy()))
        return out


def _name(kind: str, i: int, value) -> str:
    # The same on every rank for the same call; shape and dtype in it so that
    # Horovod's response cache never sees one name with two signatures.
    shape = "x".join(str(d) for d in value.shape) or "scalar"
    return f"tfdist_{kind}_{i}_{value.dtype.name}_{shape}"
