"""One all-gather's pieces: what each rank sends, padded to the largest, and what arrives.

A piece is (variable, rows) or None: a whole variable (rows None) or the row
range [start, stop) of one (`partition.row_chunks`), or nothing from that rank
in this round. Shared by the engines' owner gathers (`tfdist.zero.mwms`,
`tfdist.horovod.gather`), which differ only in the collective that moves the
padded pieces and in how a received value is assigned.
"""

from __future__ import annotations

import numpy as np


def shape(piece) -> list:
    """The shape of a piece's values."""
    v, rows = piece
    return list(v.shape) if rows is None else [rows[1] - rows[0], *v.shape[1:]]


def padded(pieces, rank: int):
    """(this rank's piece flattened and zero-padded to the largest, each rank's size, the
    padded width): what each rank puts into the all-gather."""
    import tensorflow as tf

    sizes = [0 if p is None else int(np.prod(shape(p), dtype=np.int64)) for p in pieces]
    width = max(sizes)
    dtype = next(p for p in pieces if p is not None)[0].dtype
    mine = pieces[rank]
    if mine is None:
        return tf.zeros([width], dtype), sizes, width
    v, rows = mine
    flat = tf.reshape(v.value if rows is None else v.value[rows[0]:rows[1]], [-1])
    if sizes[rank] < width:
        flat = tf.concat([flat, tf.zeros([width - sizes[rank]], dtype)], 0)
    return flat, sizes, width


def received(gathered, pieces, sizes, width: int, rank: int) -> list:
    """[(piece, value)] of every other rank's piece, cut out of the gathered tensor."""
    import tensorflow as tf

    return [(p, tf.reshape(gathered[q * width:q * width + sizes[q]], shape(p)))
            for q, p in enumerate(pieces) if p is not None and q != rank]
