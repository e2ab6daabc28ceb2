"""Initial-state broadcast from one rank: model and optimizer variables.

Why not `horovod.tensorflow.broadcast_variables` or horovod's Keras callback:
on Keras 3 variables they fail with `'Variable' object has no attribute
'ref'` (horovod#4290; see `tfdist.compat.horovod_keras`). Broadcasting each
variable's backend value and assigning it back works on Keras 3 and on plain
`tf.Variable`s.
"""

from __future__ import annotations


def broadcast_variables(variables, root_rank: int = 0) -> None:
    """Sets every variable to its value on `root_rank`.

    Args:
        variables: Keras 3 variables or `tf.Variable`s, in the same order on
            every rank (e.g. `model.variables`).
        root_rank: The rank whose values win.
    """
    import tensorflow as tf

    from tfdist.collectives.keras_callbacks import broadcast_groups
    from tfdist.horovod.collectives import HorovodCollectives

    for group in broadcast_groups(variables):
        # Not `getattr(v, "value", v)`: a tf.Variable's `value` is a method.
        values = HorovodCollectives().broadcast_tensors(
            [tf.convert_to_tensor(v) for v in group], root_rank)
        for variable, value in zip(group, values):
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
    from tfdist.collectives import keras_callbacks
    from tfdist.horovod.collectives import HorovodCollectives

    keras_callbacks.broadcast_state(model, optimizer, HorovodCollectives(), root_rank)
