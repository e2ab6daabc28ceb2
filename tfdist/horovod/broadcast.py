"""Initial-state broadcast from one rank: model and optimizer variables.

Why not `horovod.tensorflow.broadcast_variables` or horovod's Keras callback:
on Keras 3 variables they fail with `'Variable' object has no attribute
'ref'` (horovod#4290; see `tfdist.compat.horovod_keras`). Broadcasting each
variable's backend value and assigning it back works on Keras 3 and on plain
`tf.Variable`s.
"""

from __future__ import annotations

# Horovod broadcasts these dtypes only through a same-width signed type.
_BITCAST = {"uint32": "int32", "uint64": "int64"}


def broadcast_variables(variables, root_rank: int = 0) -> None:
    """Sets every variable to its value on `root_rank`.

    Args:
        variables: Keras 3 variables or `tf.Variable`s, in the same order on
            every rank (e.g. `model.variables`).
        root_rank: The rank whose values win.
    """
    import tensorflow as tf

    from tfdist.horovod import runtime

    hvd = runtime.hvd()
    for i, variable in enumerate(variables):
        value = tf.convert_to_tensor(getattr(variable, "value", variable))
        wire = _BITCAST.get(value.dtype.name)
        if wire:
            value = tf.bitcast(value, wire)
        value = hvd.broadcast(value, root_rank, name=f"tfdist_bcast_{i}", ignore_name_scope=True)
        if wire:
            value = tf.bitcast(value, variable.dtype)
        variable.assign(value)


def broadcast_state(model, optimizer=None, root_rank: int = 0) -> None:
    """Broadcasts a model's variables and its optimizer's from `root_rank`.

    Call it after building (and, on a resumed run, after rank 0 restored its
    checkpoint) and before the first step; every rank then starts from rank
    0's state, whatever seed it started from.

    Args:
        model: A built Keras model.
        optimizer: Its optimizer; `model.optimizer` when None. Built on the
            model's trainable variables first if it is not, so that its slots
            (momentum, iterations) exist on every rank and are broadcast too.
        root_rank: The rank whose state wins.
    """
    from tfdist.allreduce_optimizer import state_variables

    broadcast_variables(state_variables(model, optimizer), root_rank)
