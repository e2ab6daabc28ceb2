"""The one place tfdist overrides a Keras 3 optimizer's hooks: a gradient's path to an update.

Keras 3 runs one path for every update rule (`BaseOptimizer._backend_apply_gradients`,
keras/src/optimizers/base_optimizer.py; `TFOptimizer._backend_update_step`,
keras/src/backend/tensorflow/optimizer.py)::

    receive     _backend_apply_gradients(grads, variables), once per `optimizer.apply`
    accumulate  _backend_increment_gradient_accumulators (k - 1 of every k passes)
    reduce      } _clip_gradients, once per update: tfdist's all-reduce or reduce-scatter
    clip        }   goes first, then the clipping
    decay       _apply_weight_decay
    update      _backend_update_step: the variables this process updates, then the
                gather of what others need
    update_one  update_step: one variable's update (Keras's own rule)
    sum_replicas _all_reduce_sum_gradients: the strategy's sum before the update

and, outside Keras's path: `reduce_in_replica` (asked by
`tfdist.compat.keras_grad_reduction` before Keras's apply under a tf.distribute
strategy), `build`, `make_slot` (`add_variable_from_reference`) and `save`
(`save_own_variables`). A LossScaleOptimizer's two steps: `finite` (`check_finite`)
and `unscale` (`_stateful_handle_finite_grads`).

`GradientPath` (optimizers) and `ScaledPath` (LossScaleOptimizer) are the only classes
in tfdist, outside `tfdist/compat/` (one module per upstream bug), that override those
hooks. Each hook runs its step along the class's path: a tuple of `Step`s, outermost
first, that the strategy's hooks supply (`extended`):

- `allreduce_optimizer.AllReduce` (shm, Horovod): reduce = all-reduce;
- `zero.optimizer.OwnedOnly` (`--shard optimizer`): update = the owned variables, then
  the gather;
- `zero.gradients.ScatterFirst` / `ScatterAccumulated` (reduce = reduce-scatter onto
  the owners, before or after accumulating);
- `zero.split_optimizer.SplitRows` (`--shard parameters`): every step on this worker's
  rows;
- `model_parallel.placed_updates.Placed`: every op on its variable's device.

A step that changes a named step gets `then` (the rest of the path, ending in Keras's
own) and calls it or not. Keras's update rules stay Keras's: the path's last class is
the user's optimizer class.

What is set on an optimizer besides (declared here, with why):

- class attributes, from the steps' `marks` (`MARKS`);
- `_tfdist_step`: what the step being traced needs later in the same trace (the owners,
  the last collective), kept in `__dict__` (`trace_state`) so that Keras does not track
  the model's variables in it as the optimizer's own;
- `_tfdist_owner`: {variable key: owning worker}, set by `OwnedOnly.build`;
- `_tfdist_partial`: True once `OwnedOnly` has summed gradients onto their owners in
  place of the all-reduce (multi_worker): its clip step then adds the workers' norms,
  and a worker can report that the scatter ran (not merely that it was configured).
"""

from __future__ import annotations

import contextlib
import functools

# The class attributes a path's steps may set (`Step.marks`), and why each exists.
MARKS = {
    "_tfdist_distributed": "a DistributedOptimizer (AllReduce): wrap refuses to wrap twice; "
                           "tfdist.horovod.load_model rebuilds one from a plain class",
    "_tfdist_allreduce": "the all-reduce (AllReduce); an instance may replace it "
                         "(allreduce_optimizer.with_compression); from_config copies keep it",
    "_tfdist_sharded": "optimizer state split by worker (OwnedOnly): zero.backup.shard_of",
    "_tfdist_shard_level": "the --shard level, which a worker reports",
    "_tfdist_scatters": "gradients reduce-scattered onto their owners, which a worker reports",
    "_tfdist_gets_reduced_grads": "keras_grad_reduction must not all-reduce before apply",
}

# The steps, with the hook each runs in and what ends the path (Keras's own).
_KERAS_HOOKS = {
    "receive": "_backend_apply_gradients",
    "accumulate": "_backend_increment_gradient_accumulators",
    "clip": "_clip_gradients",
    "decay": "_apply_weight_decay",
    "update": "_backend_update_step",
    "update_one": "update_step",
    "sum_replicas": "_all_reduce_sum_gradients",
    "build": "build",
    "make_slot": "add_variable_from_reference",
    "save": "save_own_variables",
    "finite": "check_finite",
    "unscale": "_stateful_handle_finite_grads",
}
_ENDS = {
    "reduce": lambda opt, grads: grads,  # Keras reduces nothing itself
    "reduce_in_replica": lambda opt, grads, variables: None,  # None: the strategy's all-reduce
}


class Step:
    """One strategy's part of the path: defines the named steps it changes (see the
    module), each as `name(self, opt, *args, then)`, `then(*args)` being the rest of the
    path. Subclasses are hashable (frozen dataclasses): a path names a cached class."""

    marks: dict = {}  # class attributes of the optimizer class (keys of MARKS)

    def describe(self) -> str:
        """Words for the class's docstring."""
        return type(self).__name__


def extended(cls: type, step: Step) -> type:
    """The optimizer class `cls` with `step` in front of its path (cached per path).

    Args:
        cls: A Keras optimizer class (or LossScaleOptimizer), or one this returned.
        step: The step to put first.

    Returns:
        A subclass of `cls`'s Keras class (the first class in its MRO that is not
        tfdist's), with the same name and module, so that `model.save` records the plain
        optimizer and the saved model loads anywhere.
    """
    return _class(keras_class(cls), (step,) + tuple(getattr(cls, "_tfdist_path", ())))


def keras_class(cls: type) -> type:
    """The Keras optimizer class (maybe the user's own) under a tfdist class."""
    return getattr(cls, "_tfdist_keras", cls)


def steps_of(optimizer, kind: type) -> list:
    """The steps of type `kind` on `optimizer`'s path (outermost first)."""
    return [s for s in getattr(optimizer, "_tfdist_path", ()) if isinstance(s, kind)]


@functools.cache
def _class(keras: type, path: tuple) -> type:
    import keras as keras_lib

    mixin = ScaledPath if issubclass(keras, keras_lib.optimizers.LossScaleOptimizer) \
        else GradientPath
    attrs = {"__module__": keras.__module__, "_tfdist_keras": keras, "_tfdist_path": path,
             "__doc__": f"{keras.__name__} on tfdist's gradient path: "
                        + ", then ".join(s.describe() for s in path) + "."}
    for step in reversed(path):  # the outermost step's marks win
        unknown = set(step.marks) - set(MARKS)
        if unknown:
            raise TypeError(f"{type(step).__name__} sets undeclared marks {sorted(unknown)}: "
                            "declare them in gradient_path.MARKS.")
        attrs.update(step.marks)
    # Per step name, the steps that change it, in path order: read by every hook call.
    attrs["_tfdist_chains"] = {name: tuple(s for s in path if hasattr(s, name))
                               for name in (*_KERAS_HOOKS, *_ENDS)}
    return type(keras.__name__, (mixin, keras), attrs)


def _run(opt, name: str, *args):
    """Runs step `name` along `opt`'s path, ending in Keras's own."""
    cls = type(opt)
    chain = cls._tfdist_chains[name]
    end = _ENDS.get(name) or getattr(cls._tfdist_keras, _KERAS_HOOKS[name])

    def call(i, *a):
        if i == len(chain):
            return end(opt, *a)
        return getattr(chain[i], name)(opt, *a, then=functools.partial(call, i + 1))

    return call(0, *args)


class GradientPath:
    """A Keras optimizer's hooks, each running its step along the class's path."""

    def _backend_apply_gradients(self, grads, trainable_variables):
        return _run(self, "receive", grads, trainable_variables)

    def _backend_increment_gradient_accumulators(self, grads, acc_grads):
        return _run(self, "accumulate", grads, acc_grads)

    def _clip_gradients(self, grads):
        return _run(self, "clip", _run(self, "reduce", grads))

    def _apply_weight_decay(self, variables):
        return _run(self, "decay", variables)

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        return _run(self, "update", grads, trainable_variables, learning_rate)

    def update_step(self, gradient, variable, learning_rate):
        return _run(self, "update_one", gradient, variable, learning_rate)

    def _all_reduce_sum_gradients(self, grads_and_vars):
        return _run(self, "sum_replicas", grads_and_vars)

    def _tfdist_reduce_grads(self, grads, variables):
        # tfdist.compat.keras_grad_reduction asks before Keras's apply; None: all-reduce.
        return _run(self, "reduce_in_replica", grads, variables)

    def build(self, variables):
        return _run(self, "build", variables)

    def add_variable_from_reference(self, reference_variable, name=None, initializer="zeros"):
        return _run(self, "make_slot", reference_variable, name, initializer)

    def save_own_variables(self, store):
        return _run(self, "save", store)


class ScaledPath:
    """A LossScaleOptimizer's hooks, each running its step along the class's path."""

    def check_finite(self, grads):
        return _run(self, "finite", grads)

    def _stateful_handle_finite_grads(self, grads, trainable_variables):
        return _run(self, "unscale", grads, trainable_variables)

    def save_own_variables(self, store):
        return _run(self, "save", store)


def trace_state(optimizer) -> dict:
    """What the step being traced keeps for its later steps (see the module)."""
    return optimizer.__dict__.setdefault("_tfdist_step", {})


def set_trace_state(optimizer, **values) -> dict:
    """Updates `trace_state(optimizer)` with `values`; returns it."""
    state = trace_state(optimizer)
    state.update(values)
    return state


def squared_sum(grads, placed: bool = False):
    """Keras's squared global norm of `grads` (None ones skipped; 0.0 for none): each
    gradient's square-sum on its device when `placed`."""
    from keras import ops

    squared = []
    for g in grads:
        if g is not None:
            with _on_device_of(g, placed):
                squared.append(ops.sum(ops.square(g)))
    return ops.sum(ops.stack(squared)) if squared else ops.convert_to_tensor(0.0)


def clip_by_global_norm(grads, clip_norm, counted=None, scaled=None, total=None,
                        placed: bool = False) -> list:
    """Keras's `clip_by_global_norm` (keras/src/optimizers/base_optimizer.py: the same
    ops in the same order), for a process that holds part of the gradients.

    Args:
        grads: The gradients (None ones stay None).
        clip_norm: The global norm to clip to.
        counted: Per gradient, whether its squares are in this process's sum (None: all).
        scaled: Per gradient, whether it is scaled here (None: all); the others are
            returned as they are.
        total: Maps this process's squared sum to the whole one (e.g. an all-reduce
            sum over the workers); None: it is the whole one.
        placed: Each gradient's square-sum and scaling on the gradient's device.
    """
    from keras import ops

    counted = [True] * len(grads) if counted is None else counted
    scaled = [True] * len(grads) if scaled is None else scaled
    local = squared_sum([g for g, c in zip(grads, counted) if c], placed)
    use_norm = ops.sqrt(total(local) if total is not None else local)
    scale_for_finite = clip_norm * ops.minimum(1.0 / use_norm, 1.0 / clip_norm)
    # Keras's: a no-op for a finite norm, NaN (so the step is not finite) otherwise.
    scale = scale_for_finite + (use_norm - use_norm)
    out = []
    for g, s in zip(grads, scaled):
        if g is None or not s:
            out.append(g)
            continue
        with _on_device_of(g, placed):
            out.append(g * scale)
    return out


def _on_device_of(tensor, placed: bool):
    import tensorflow as tf

    return tf.device(tensor.device) if placed else contextlib.nullcontext()
