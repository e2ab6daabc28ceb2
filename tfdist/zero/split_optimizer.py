"""The optimizer of a model split by rows (`--shard parameters`, `tfdist.zero.parameters`).

`optimizer_class(distributed, engine, rank, n)` puts `SplitRows` in front of
`distributed`: an engine's DistributedOptimizer class, whose `_clip_gradients`
all-reduces through `_tfdist_allreduce` (shm, horovod), or a Keras optimizer
class under MultiWorkerMirrored, whose gradients
`tfdist.compat.keras_grad_reduction` reduces before Keras's `apply`
(`_tfdist_reduce_grads`: the whole variables' only). The split variables'
gradients arrive reduced (their reduce-scatter ran in the backward pass), so
only the whole variables' are all-reduced; global-norm clipping adds the
workers' squared norms of their rows (one scalar all-reduce) to the whole
variables' squared norm.

Under a tf.distribute strategy the split variables, their slots and
accumulators are this worker's plain variables (its rows), which the
strategy's `extended.update` refuses: Keras's update, weight decay and
accumulation run on them directly, as Keras's own functions do inside it.
"""

from __future__ import annotations

import functools

from tfdist.errors import ConfigError
from tfdist.zero import partition
from tfdist.zero.parameters import ROWS, chain, full_shape, rows_of


def _split_apart(variables):
    """(whole indexes, split indexes) of `variables`: under a strategy only."""
    import tensorflow as tf

    split = [i for i, v in enumerate(variables) if rows_of(v) is not None] \
        if tf.distribute.has_strategy() else []
    taken = set(split)
    return [i for i in range(len(variables)) if i not in taken], split


class SplitRows:
    """The overrides for split variables, in front of a distributed optimizer class.

    `optimizer_class` sets, as class attributes: `_tfdist_rows_over` (the class
    it extends), `_tfdist_keras_base` (Keras's own class under it),
    `_tfdist_engine` (the engine's collectives), `_tfdist_rank`, `_tfdist_size`.
    """

    _tfdist_shard_level = "parameters"
    _tfdist_scatters = True  # the split variables' gradients: reduce-scattered

    def _tfdist_reduce_grads(self, grads, variables):
        # multi_worker: the whole variables' gradients summed; the split ones arrive
        # reduced (their reduce-scatter ran in the backward pass).
        import tensorflow as tf

        ctx = tf.distribute.get_replica_context()
        out = list(grads)
        whole = [i for i, (g, v) in enumerate(zip(grads, variables))
                 if g is not None and rows_of(v) is None]
        if whole:
            summed = ctx.all_reduce(tf.distribute.ReduceOp.SUM, [grads[i] for i in whole])
            for i, g in zip(whole, summed):
                out[i] = g
        return out

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        variables = list(trainable_variables)
        whole, split = _split_apart(variables)
        if whole:
            self._tfdist_rows_over._backend_update_step(
                self, [grads[i] for i in whole], [variables[i] for i in whole], learning_rate)
        for i in split:
            if grads[i] is not None:
                self.update_step(grads[i], variables[i].value, learning_rate)

    def _apply_weight_decay(self, variables):
        import tensorflow as tf

        variables = list(variables)
        whole, split = _split_apart(variables)
        self._tfdist_rows_over._apply_weight_decay(self, [variables[i] for i in whole])
        if self.weight_decay is None:
            return
        for i in split:  # Keras's weight_decay_fn (keras/src/backend/tensorflow/optimizer.py)
            v = variables[i].value
            if self._use_weight_decay(variables[i]):
                lr = tf.cast(self.learning_rate, v.dtype)
                wd = tf.cast(self.weight_decay, v.dtype)
                v.assign_sub(v * wd * lr)

    def _backend_increment_gradient_accumulators(self, grads, acc_grads):
        acc_grads = list(acc_grads)
        whole, split = _split_apart(acc_grads)
        if whole:
            self._tfdist_rows_over._backend_increment_gradient_accumulators(
                self, [grads[i] for i in whole], [acc_grads[i] for i in whole])
        for i in split:
            acc_grads[i].assign(grads[i] + acc_grads[i])

    def _backend_apply_gradients(self, grads, trainable_variables):
        from tfdist.zero.gradients import _set_step

        variables = list(trainable_variables)
        _set_step(self, {"split": [rows_of(v) is not None for v in variables]})
        return self._tfdist_keras_base._backend_apply_gradients(self, grads, variables)

    def _clip_gradients(self, grads):
        if (self.clipnorm or 0) > 0:
            raise ConfigError(
                f"--shard parameters cannot clip each variable's norm (clipnorm="
                f"{self.clipnorm}): a worker holds rows of it. Received: clipnorm="
                f"{self.clipnorm}. Use global_clipnorm (--clipnorm), or --shard gradients.")
        split = self._tfdist_step["split"]
        grads = self._reduce_whole(grads, split)
        if not (self.global_clipnorm or 0) > 0:
            return self._tfdist_keras_base._clip_gradients(self, grads)
        return self._clip_by_global_norm(grads, split)

    def _reduce_whole(self, grads, split):
        """The whole variables' gradients all-reduced by the engine's DistributedOptimizer
        (multi_worker reduced them before Keras's apply: `_tfdist_reduce_grads`)."""
        c = chain()
        whole = [None if s else g for g, s in zip(grads, split)]
        if hasattr(self, "_tfdist_allreduce") and any(g is not None for g in whole):
            with c.next():
                reduced = self._tfdist_allreduce(whole)
            got = [g for g in reduced if g is not None]
            c.last = getattr(got[-1], "values", got[-1]) if got else c.last
        else:
            reduced = whole
        return [g if s else r for g, r, s in zip(grads, reduced, split)]

    def _clip_by_global_norm(self, grads, split):
        """Keras's clip_by_global_norm: the rows' squares summed over the workers, the
        whole variables' (equal everywhere) counted once."""
        import tensorflow as tf

        def squares(pick):
            terms = [tf.reduce_sum(tf.square(tf.convert_to_tensor(g)))
                     for g, s in zip(grads, split) if g is not None and s == pick]
            return tf.add_n(terms) if terms else tf.constant(0.0)

        c = chain()
        with c.next():
            rows_total = self._tfdist_engine.all_sum(squares(True))
            c.last = rows_total
        norm = tf.sqrt(rows_total + squares(False))
        clip = self.global_clipnorm
        scale = clip * tf.minimum(1.0 / norm, 1.0 / clip)
        return [None if g is None else g * tf.cast(scale, g.dtype) for g in grads]

    def add_variable_from_reference(self, reference_variable, name=None, initializer="zeros"):
        keras_base = self._tfdist_keras_base
        rows = rows_of(reference_variable)
        if rows is not None:
            import tensorflow as tf

            from keras.src.optimizers.base_optimizer import BaseOptimizer

            from tfdist.zero.optimizer import _outside_strategy

            # A plain variable of this worker; not colocated through the strategy
            # (which refuses a variable made outside its scope).
            with _outside_strategy():
                add = BaseOptimizer.add_variable_from_reference \
                    if tf.distribute.has_strategy() else keras_base.add_variable_from_reference
                slot = add(self, reference_variable, name=name, initializer=initializer)
        else:
            slot = keras_base.add_variable_from_reference(self, reference_variable, name=name,
                                                          initializer=initializer)
        if rows is not None and tuple(slot.shape) == tuple(reference_variable.shape):
            setattr(slot, ROWS, rows)  # this worker's rows of the whole slot
            slot._tfdist_split = reference_variable._tfdist_split
        return slot

    def build(self, variables):
        self._tfdist_rows_over.build(self, variables)
        print(holdings(list(variables), list(self.variables), self._tfdist_rank,
                       self._tfdist_size), flush=True)


@functools.cache
def optimizer_class(distributed: type, engine, rank: int, n: int) -> type:
    """`SplitRows` in front of `distributed` (see the module).

    Args:
        distributed: The DistributedOptimizer class, or the Keras optimizer class.
        engine: Hashable; the engine's collectives (`all_sum` is used).
        rank: This worker's rank.
        n: Data-parallel workers.
    """
    from tfdist.zero.gradients import _keras_base

    return type(distributed.__name__, (SplitRows, distributed), {
        "__module__": distributed.__module__,
        "__doc__": f"{distributed.__name__} of a model whose weights are split across workers.",
        "_tfdist_rows_over": distributed,
        "_tfdist_keras_base": _keras_base(distributed),
        "_tfdist_engine": engine,
        "_tfdist_rank": rank,
        "_tfdist_size": n,
    })


def optimizer(distributed, engine, rank: int, n: int):
    """A copy of `distributed` (unbuilt, an engine's DistributedOptimizer) for split
    variables (`optimizer_class`), built from its config."""
    if getattr(distributed, "built", False):
        raise ValueError("zero.split_optimizer.optimizer() needs an optimizer that has not "
                         "been built.")
    refuse_whole_weight(distributed)
    from tfdist.zero.optimizer import rebuilt

    return rebuilt(optimizer_class(type(distributed), engine, rank, n), distributed)


def refuse_whole_weight(optimizer) -> None:
    """One line for an optimizer whose update reads a whole weight (`tfdist.optim`), which
    a worker holding rows cannot run: the `tfdist.setup()` path's check (the command
    line's is `partition.check_config`, before TensorFlow starts).

    Raises:
        ConfigError: naming the optimizer.
    """
    from tfdist.optim import whole_weight_optimizer

    inner = whole_weight_optimizer(optimizer)
    if inner is not None:
        raise ConfigError(
            f"--shard parameters splits every weight across the workers, and "
            f"{type(inner).__name__}'s update reads a whole weight. Received: "
            f"{type(inner).__name__} at shard="
            "\"parameters\". Use shard=\"gradients\" (each worker updates whole variables), "
            "or another optimizer.")


def holdings(variables, slots, rank: int, n: int) -> str:
    """The line a worker prints before its first step, of what it will hold at
    `--shard parameters` (its rows, the largest layer it gathers, its optimizer state)."""
    from tfdist.zero.optimizer import variable_bytes

    mine = sum(variable_bytes(v) for v in variables)
    whole = [v for v in variables if rows_of(v) is None]
    total = sum(_whole_bytes(v) for v in variables)
    largest = max((_whole_bytes(v) for v in variables if rows_of(v) is not None), default=0)
    state = sum(variable_bytes(v) for v in slots if len(v.shape))
    return (f"tfdist: worker {rank} of {n} (--shard parameters) holds "
            f"{partition._bytes(mine)} of the {partition._bytes(total)} of weights (its rows of "
            f"{len(variables) - len(whole)} split variables, {len(whole)} whole), gathers at "
            f"most one layer at a time (the largest weight {partition._bytes(largest)}), holds "
            f"the optimizer state of its rows ({partition._bytes(state)}) and receives only "
            "their reduced gradients")


def _whole_bytes(variable) -> int:
    import numpy as np

    return int(np.prod(full_shape(variable), dtype=np.int64)) * np.dtype(variable.dtype).itemsize
