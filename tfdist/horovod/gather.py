"""Every rank gets each variable from the rank that owns it, over Horovod (`--shard-optimizer-state`).

One `hvd.allgather` per piece: the same op, with the same name, on every
rank, whatever each rank owns. Each piece leaves after every reduced
gradient has arrived (`keep`, `_keep`: Horovod's ops are not stateful, and an
unused one would be dropped from this rank's graph while its peers wait).

The pieces are those of `tfdist.zero.mwms` (round by round, `partition.rounds`:
each rank's k-th largest variable; big ones in row ranges of at most
`CHUNK_ELEMENTS`, `partition.row_chunks`): each rank flattens its piece,
pads it to the largest, and the gathered rows are assigned as they arrive,
so one piece's buffers are alive at a time. Each rank sends the S/n bytes it
owns and receives S(n-1)/n: the all-gather half of an all-reduce.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfdist.zero import partition
from tfdist.zero import pieces as pieces_lib

# Elements each rank puts in one allgather (16 MB of float32), as tfdist.zero.mwms.
CHUNK_ELEMENTS = 4 << 20


@dataclasses.dataclass(frozen=True)
class OwnerGather:
    """Sets every variable to its owner's value (hashable: a sharded optimizer's class attribute).

    Attributes:
        chunk_elements: The most elements of one rank's piece in one allgather.
    """

    chunk_elements: int = CHUNK_ELEMENTS

    def keep(self, tensors):
        """A token computed from every tensor in `tensors` (see `_keep`): pass it as `after`."""
        return _keep(tensors)

    def __call__(self, variables, owners, rank, after=None):
        from tfdist.horovod import runtime

        hvd = runtime.hvd()
        n = hvd.size()
        if n == 1:
            return
        by_dtype: dict = {}
        for i, v in enumerate(variables):
            by_dtype.setdefault(np.dtype(v.dtype), []).append(i)
        count = 0  # collectives are paired across ranks by name: the same sequence everywhere
        gathered = []
        for index in by_dtype.values():
            sizes = [variables[i].shape.num_elements() for i in index]
            for members in partition.rounds(sizes, [owners[i] for i in index], n):
                members = [None if m is None else variables[index[m]] for m in members]
                plans = [None if v is None else partition.row_chunks(tuple(v.shape),
                                                                    self.chunk_elements)
                         for v in members]
                for j in range(max(len(p) for p in plans if p is not None)):
                    gathered.append(_gather_piece(
                        hvd, [None if v is None or j >= len(p) else (v, p[j])
                              for v, p in zip(members, plans)], rank,
                        f"tfdist_zero_gather_{count}", after))
                    count += 1
        _keep(gathered)  # a piece only this rank owned is used nowhere here


def _keep(tensors):
    """A stateful op reading one element of each tensor, so that none is pruned.

    Horovod's collective ops are not stateful, so TensorFlow drops one whose
    result the graph does not use; the other ranks then wait for it for ever
    (2 Gloo ranks did, in the first sharded step). A stateful op is never
    dropped, nor is what it reads. Returns its output, a token that is
    computed after all of them.
    """
    import tensorflow as tf

    heads = [tf.reshape(t, [-1])[:1] for t in tensors]
    return tf.numpy_function(lambda *_: np.int8(0), heads, tf.int8, stateful=True,
                             name="tfdist_keep_collectives")


def _gather_piece(hvd, pieces, rank: int, name: str, after=None):
    """One allgather of each rank's piece (variable, rows or None), padded to the largest;
    returns what it gathered."""
    import tensorflow as tf

    flat, sizes, width = pieces_lib.padded(pieces, rank)
    if after is not None:  # a data edge: a control edge into the padding constant was not kept
        flat = tf.numpy_function(lambda x, _: x, [flat, after], flat.dtype, stateful=True,
                                 name="tfdist_after")
        flat.set_shape([width])
    gathered = hvd.allgather(flat, name=name, ignore_name_scope=True)
    for (v, rows), value in pieces_lib.received(gathered, pieces, sizes, width, rank):
        if rows is None:
            v.assign(value)
        else:
            v.value[rows[0]:rows[1]].assign(value)
    return gathered
