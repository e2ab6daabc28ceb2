"""The optimizer of a model split by rows (`--shard parameters`, `tfdist.zero.parameters`).

`optimizer(distributed, engine, rank, n)` puts `SplitRows`, steps of
`tfdist.gradient_path`, in front of `distributed`'s: an engine's DistributedOptimizer,
which all-reduces through `_tfdist_allreduce` (shm, horovod), or a Keras optimizer
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

import dataclasses

from tfdist import gradient_path
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


@dataclasses.dataclass(frozen=True)
class SplitRows(gradient_path.Step):
    """The path's steps for split variables, in front of an engine's `AllReduce` or a
    Keras optimizer under MultiWorkerMirrored (see the module).

    Fields:
        engine: Hashable; the engine's collectives (`all_sum` is used).
        rank: This worker's rank.
        size: Data-parallel workers.
    """

    engine: object
    rank: int
    size: int

    marks = {"_tfdist_shard_level": "parameters",
             "_tfdist_scatters": True}  # the split variables' gradients: reduce-scattered

    def describe(self) -> str:
        return f"SplitRows (worker {self.rank} of {self.size})"

    def reduce_in_replica(self, opt, grads, variables, then):
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

    def update(self, opt, grads, trainable_variables, learning_rate, then):
        variables = list(trainable_variables)
        whole, split = _split_apart(variables)
        if whole:
            then([grads[i] for i in whole], [variables[i] for i in whole], learning_rate)
        for i in split:
            if grads[i] is not None:
                opt.update_step(grads[i], variables[i].value, learning_rate)

    def decay(self, opt, variables, then):
        import tensorflow as tf

        variables = list(variables)
        whole, split = _split_apart(variables)
        then([variables[i] for i in whole])
        if opt.weight_decay is None:
            return
        for i in split:  # Keras's weight_decay_fn (keras/src/backend/tensorflow/optimizer.py)
            v = variables[i].value
            if opt._use_weight_decay(variables[i]):
                lr = tf.cast(opt.learning_rate, v.dtype)
                wd = tf.cast(opt.weight_decay, v.dtype)
                v.assign_sub(v * wd * lr)

    def accumulate(self, opt, grads, acc_grads, then):
        acc_grads = list(acc_grads)
        whole, split = _split_apart(acc_grads)
        if whole:
            then([grads[i] for i in whole], [acc_grads[i] for i in whole])
        for i in split:
            acc_grads[i].assign(grads[i] + acc_grads[i])

    def receive(self, opt, grads, trainable_variables, then):
        variables = list(trainable_variables)
        gradient_path.set_trace_state(opt, split=[rows_of(v) is not None for v in variables])
        return then(grads, variables)

    def reduce(self, opt, grads, then):
        """The whole variables' gradients all-reduced by the engine's AllReduce (in its
        place: multi_worker reduced them before Keras's apply, `reduce_in_replica`)."""
        split = gradient_path.trace_state(opt)["split"]
        c = chain()
        whole = [None if s else g for g, s in zip(grads, split)]
        if hasattr(opt, "_tfdist_allreduce") and any(g is not None for g in whole):
            with c.next():
                reduced = opt._tfdist_allreduce(whole)
            got = [g for g in reduced if g is not None]
            c.last = getattr(got[-1], "values", got[-1]) if got else c.last
        else:
            reduced = whole
        return [g if s else r for g, r, s in zip(grads, reduced, split)]

    def clip(self, opt, grads, then):
        if (opt.clipnorm or 0) > 0:
            raise ConfigError(
                f"--shard parameters cannot clip each variable's norm (clipnorm="
                f"{opt.clipnorm}): a worker holds rows of it. Received: clipnorm="
                f"{opt.clipnorm}. Use global_clipnorm (--clipnorm), or --shard gradients.")
        if not (opt.global_clipnorm or 0) > 0:
            return then(grads)
        # The rows' squares summed over the workers, the whole variables' (equal
        # everywhere) counted once.
        split = gradient_path.trace_state(opt)["split"]
        c = chain()

        def total(rows_squared):
            with c.next():
                c.last = rows_total = self.engine.all_sum(rows_squared)
            return rows_total + gradient_path.squared_sum(
                [g for g, s in zip(grads, split) if not s])

        return gradient_path.clip_by_global_norm(grads, opt.global_clipnorm, counted=split,
                                                 total=total)

    def make_slot(self, opt, reference_variable, name, initializer, then):
        rows = rows_of(reference_variable)
        if rows is not None:
            import tensorflow as tf

            from keras.src.optimizers.base_optimizer import BaseOptimizer

            from tfdist.zero.optimizer import _outside_strategy

            # A plain variable of this worker; not colocated through the strategy
            # (which refuses a variable made outside its scope).
            with _outside_strategy():
                if tf.distribute.has_strategy():
                    slot = BaseOptimizer.add_variable_from_reference(
                        opt, reference_variable, name=name, initializer=initializer)
                else:
                    slot = then(reference_variable, name, initializer)
        else:
            slot = then(reference_variable, name, initializer)
        if rows is not None and tuple(slot.shape) == tuple(reference_variable.shape):
            setattr(slot, ROWS, rows)  # this worker's rows of the whole slot
            slot._tfdist_split = reference_variable._tfdist_split
        return slot

    def build(self, opt, variables, then):
        then(variables)
        print(holdings(list(variables), list(opt.variables), self.rank, self.size),
              flush=True)


def optimizer(distributed, engine, rank: int, n: int):
    """A copy of `distributed` (unbuilt, an engine's DistributedOptimizer) for split
    variables (`SplitRows`), built from its config."""
    if getattr(distributed, "built", False):
        raise ValueError("zero.split_optimizer.optimizer() needs an optimizer that has not "
                         "been built.")
    refuse_whole_weight(distributed)
    from tfdist.zero.optimizer import rebuilt

    return rebuilt(gradient_path.extended(type(distributed), SplitRows(engine, rank, n)),
                   distributed)


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
