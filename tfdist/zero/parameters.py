"""`--shard parameters` (ZeRO stage 3, FSDP): each worker holds only its rows of each weight.

What is split: every variable of a leaf layer (one that owns trainable
variables, no non-trainable ones and no sub-layer with variables: Dense,
Embedding, EinsumDense, LayerNormalization, ...) is cut on its first axis
(`partition.row_share`: ceil(rows / n) rows per worker, zero rows padding the
last), and the Keras variable's storage becomes this worker's rows: its
shape, its optimizer slots and its gradient accumulator are the share.
Variables of other layers (BatchNormalization's, a layer's with sub-layers)
stay whole on every worker and are all-reduced as without sharding.

How a split layer runs (`_SplitCall`): its `call` becomes one
`tf.custom_gradient` whose forward pass all-gathers the rows of its weights,
calls the layer with the whole weights (Keras's `StatelessScope` maps each
variable to its gathered value), and drops them; nothing of them is kept for
the backward pass. Its backward pass gathers the weights again, recomputes
the layer under a tape (a layer's activations inside it are recomputed, as
`tf.recompute_grad` does: up to one more forward pass of compute), and
reduce-scatters the weights' gradients, averaged, so each worker receives its
rows of the mean gradient: the same math as one replica at the global batch.
A weight is therefore whole only while its layer runs, forward or backward.

Order: the shared-memory engine matches collectives by order, and
TensorFlow's executor does not order independent ops, so every collective of
a traced function waits for the one traced before it (`_Chain`): the same
sequence on every rank (Horovod matches by name, and the names come from the
same sequence).

The optimizer (`tfdist.zero.split_optimizer`): the split variables' gradients
arrive reduced, so only the whole variables' are all-reduced; global-norm
clipping adds the workers' squared norms of their rows. Accumulation,
learning-rate schedules, weight decay and mixed precision's skip (every
worker's verdict combined, `allreduce_optimizer.loss_scale_if_float16`) act
on rows as on whole variables, because each is elementwise. An optimizer
whose update reads a whole weight (lamb, adafactor, muon) is refused
(`partition.check_config`).
"""

from __future__ import annotations

import contextlib
import weakref

from tfdist.zero import partition

# Marks a variable holding this worker's rows only: (start, stop, per, rows) of its first axis.
ROWS = "_tfdist_rows"


def rows_of(variable):
    """(start, stop, per, rows) of a split variable, or None for a whole one."""
    return getattr(variable, ROWS, None)


def full_shape(variable) -> tuple:
    """The shape of the whole variable (its own shape when it is not split)."""
    rows = rows_of(variable)
    shape = tuple(variable.shape)
    return shape if rows is None else (rows[3], *shape[1:])


class _Chain:
    """The last collective traced in one graph: the next one waits for it."""

    def __init__(self, last=None):
        self.last = last
        self.count = 0
        # The inputs of the split layer traced last: the next layer's gather waits for them,
        # so it may overlap that layer's compute but not run further ahead (one layer's
        # weights gathered in advance, not the whole model's).
        self.inputs = ()

    @contextlib.contextmanager
    def next(self, *extra):
        """A scope for the next collective: it runs after the previous one (and `extra`)."""
        import tensorflow as tf

        deps = [t for t in (self.last, *extra) if t is not None]
        self.count += 1
        with tf.control_dependencies(deps) if deps and not tf.executing_eagerly() else \
                contextlib.nullcontext():
            yield self


_CHAINS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def chain() -> _Chain:
    """The collective order of the graph being traced (a branch's starts after its outer
    graph's last collective, which the branch's op then waits for)."""
    import tensorflow as tf

    graph = tf.compat.v1.get_default_graph()
    found = _CHAINS.get(graph)
    if found is None:
        outer = getattr(graph, "outer_graph", None)
        parent = _CHAINS.get(outer) if outer is not None else None
        found = _CHAINS[graph] = _Chain(parent.last if parent is not None else None)
    return found


def _gather(engine, shard, rows, n: int, after=()):
    """The whole weight from every worker's rows (`rows`: the variable's ROWS), gathered
    after the previous collective and the tensors `after`."""
    import tensorflow as tf

    c = chain()
    with c.next(*after):
        flat = engine.all_gather(tf.reshape(shard, [-1]), f"tfdist_zero3_gather_{c.count}")
        c.last = flat
    return tf.reshape(flat, [n * rows[2], *shard.shape[1:]])[:rows[3]]


def _scatter(engine, grad, rows, n: int, rank: int):
    """This worker's rows of `grad` (a whole weight's local gradient) averaged over workers."""
    import tensorflow as tf

    grad = tf.convert_to_tensor(grad)  # an Embedding's IndexedSlices, made dense
    per, total = rows[2], rows[3]
    if n * per > total:
        grad = tf.pad(grad, [[0, n * per - total]] + [[0, 0]] * (grad.shape.rank - 1))
    c = chain()
    with c.next():
        mine = engine.reduce_rows(tf.reshape(grad, [-1]), rank, n,
                                  f"tfdist_zero3_scatter_{c.count}")
        c.last = mine
    return tf.reshape(mine, [per, *grad.shape[1:]])


class _SplitCall:
    """A split layer's `call`: gather, call, drop; in the backward pass gather again,
    recompute, reduce-scatter (see the module)."""

    def __init__(self, layer, variables, engine, rank: int, n: int):
        self.variables = list(variables)
        self.original = layer.call
        self.engine, self.rank, self.n = engine, rank, n

    def _run(self, whole, args, kwargs):
        from keras import StatelessScope

        scope = StatelessScope(initialize_variables=False)
        for v, w in zip(self.variables, whole):
            # Keras's own check wants the variable's (split) shape: the value goes in directly.
            scope.state_mapping[id(v)] = w
        # The layer sees whole shapes while it runs (Keras's `add` reads a bias's shape to
        # choose BiasAdd): the split ones are put back after.
        split = [(v, v._shape) for v in self.variables]
        try:
            for v in self.variables:
                v._shape = full_shape(v)
            with scope:
                return self.original(*args, **kwargs)
        finally:
            for v, shape in split:
                v._shape = shape

    def __call__(self, *args, **kwargs):
        import tensorflow as tf

        from keras.src.backend import any_symbolic_tensors

        if any_symbolic_tensors(args, kwargs):  # shape inference: zeros stand in
            return self._run([tf.zeros(full_shape(v), v.dtype) for v in self.variables],
                             args, kwargs)
        flat = tf.nest.flatten((args, kwargs))
        take = [i for i, a in enumerate(flat)
                if isinstance(a, tf.Tensor) and a.dtype.is_floating]
        rows = [rows_of(v) for v in self.variables]
        engine, rank, n = self.engine, self.rank, self.n
        # The backward pass runs outside the layer's __call__: its recompute casts the
        # weights as the forward pass did (mixed precision's autocast).
        from keras.src.backend import AutocastScope, get_autocast_scope

        autocast = get_autocast_scope()
        autocast_dtype = None if autocast is None else autocast.dtype

        def rebuild(inputs):
            given = list(flat)
            for i, x in zip(take, inputs):
                given[i] = x
            return tf.nest.pack_sequence_as((args, kwargs), given)

        @tf.custom_gradient
        def split_call(*xs):
            inputs, shards = xs[:len(take)], xs[len(take):]
            c = chain()
            ahead, c.inputs = c.inputs, tuple(inputs)  # gathered while the layer before runs
            whole = [_gather(engine, s, r, n, after=ahead) for s, r in zip(shards, rows)]
            a, k = rebuild(inputs)
            out = self._run(whole, a, k)
            del whole  # not kept for the backward pass: gathered again there

            def grad(*dys):
                dys = [tf.zeros_like(o) if d is None else d
                       for d, o in zip(dys, tf.nest.flatten(out))]
                c = chain()
                with c.next(*dys):  # not before the gradients reach this layer
                    c.last = tf.identity(c.last) if c.last is not None else None
                again = [_gather(engine, s, r, n) for s, r in zip(shards, rows)]
                with tf.GradientTape() as tape, AutocastScope(autocast_dtype):
                    tape.watch(list(inputs) + again)
                    a2, k2 = rebuild(inputs)
                    out2 = self._run(again, a2, k2)
                got = tape.gradient(tf.nest.flatten(out2), list(inputs) + again,
                                    output_gradients=dys)
                d_in, d_whole = got[:len(inputs)], got[len(inputs):]
                d_rows = [None if g is None else _scatter(engine, g, r, n, rank)
                          for g, r in zip(d_whole, rows)]
                d_rows = [tf.zeros_like(s) if g is None else g for g, s in zip(d_rows, shards)]
                return list(d_in) + d_rows

            return out, grad

        # The raw reads of the rows: the tape sees each variable read here, and its
        # gradient is this worker's rows of the mean gradient.
        shards = [v._value.value() for v in self.variables]
        return split_call(*[flat[i] for i in take], *shards)


class Split:
    """A split model's collectives outside training: the whole value of a split variable
    for the chief's writes (a backup, the final model), one variable at a time.

    The chief leads: `fetch(i)` tells every worker which variable of the
    shared list comes next (a broadcast of its index), and all of them send
    their rows; the others `serve` the chief's requests until it is `done`.
    So the chief holds one whole variable at a time, never the whole model,
    and it may ask in any order (Keras's writers pick theirs).

    Backups do not go through it: each worker writes its own rows
    (`tfdist.zero.row_parts`), and the engine's barrier orders the chief's record after
    them.

    Args:
        collectives: The engine's host collectives (rank 0 is the chief).
        n: Workers.
        rank: This worker's rank.
    """

    def __init__(self, collectives, n: int, rank: int = 0):
        self.collectives, self.n, self.rank = collectives, n, rank

    def gather(self, variable):
        """Every worker's rows of `variable`, as one array (every worker calls it)."""
        import numpy as np

        start, stop, per, total = rows_of(variable)
        mine = np.asarray(variable.numpy())
        parts = [self.collectives.broadcast([mine], q)[0] for q in range(self.n)]
        return np.concatenate(parts, axis=0)[:total]

    def fetch(self, variables, i: int):
        """On the chief: the whole value of split `variables[i]` (the others serve)."""
        import numpy as np

        self.collectives.broadcast([np.array([i], np.int64)], 0)
        return self.gather(variables[i])

    def done(self) -> None:
        """On the chief: the serving workers may go on."""
        import numpy as np

        self.collectives.broadcast([np.array([-1], np.int64)], 0)

    def serve(self, variables) -> None:
        """On the others: sends rows of what the chief asks for, until it is done."""
        import numpy as np

        while True:
            (index,) = self.collectives.broadcast([np.array([0], np.int64)], 0)
            if int(index[0]) < 0:
                return
            self.gather(variables[int(index[0])])

    def chief_writes(self, served, is_chief: bool, write):
        """`write()` on the chief while the others serve its requests for `served` (the
        split variables of `whole_view`); its result on the chief, None elsewhere."""
        if not is_chief:
            self.serve(served)
            return None
        try:
            return write()
        finally:
            self.done()


class Whole:
    """A split variable seen whole by a backup or a final save: its full shape; `numpy()`
    (on the chief, while the others serve) gathers it; `assign(value)` of a whole value
    keeps this worker's rows."""

    def __init__(self, variable, split: Split, variables: list, index: int):
        self.variable, self.split = variable, split
        self._variables, self._index = variables, index
        self.shape = full_shape(variable)
        self.dtype = variable.dtype
        self.name = variable.name
        self.path = getattr(variable, "path", variable.name)

    def numpy(self):
        return self.split.fetch(self._variables, self._index)

    def assign(self, value):
        import numpy as np

        self.assign_rows(lambda a, b: np.asarray(value)[a:b])

    def assign_rows(self, read):
        """Keeps this worker's rows of the whole value: `read(start, stop)` gives them."""
        import numpy as np

        start, stop, _, _ = rows_of(self.variable)
        mine = np.zeros_like(self.variable.numpy())  # the padded share, zero past `stop`
        if stop > start:
            mine[:stop - start] = read(start, stop)
        self.variable.assign(mine)


def whole_view(variables) -> tuple[list, "Split | None", list]:
    """(`variables` with each split one replaced by a `Whole`, the model's `Split` or None,
    the split variables in order: what the others `serve`)."""
    variables = list(variables)
    split_vars = [v for v in variables if rows_of(v) is not None]
    if not split_vars:
        return variables, None, []
    split = getattr(split_vars[0], "_tfdist_split")
    index = {id(v): i for i, v in enumerate(split_vars)}
    return ([Whole(v, split, split_vars, index[id(v)]) if id(v) in index else v
             for v in variables], split, split_vars)


def whole_values(model, every) -> dict:
    """`final_weights.values_of(model)` with each split weight read whole (on the chief,
    while the others serve) when Keras's writer reaches it.

    Args:
        model: A split model.
        every: `whole_view(model.weights)`'s first item.
    """
    from tfdist import final_weights as fw

    read = fw.values_of(model)
    for v in every:
        if isinstance(v, Whole):
            read[v.path] = fw.Lazy(v.shape, v.numpy)
    return read


def split_layers(model) -> list:
    """The layers `--shard parameters` splits (see the module), in the model's order."""
    out = []
    for layer in model._flatten_layers(include_self=False, recursive=True):
        own = list(getattr(layer, "_trainable_variables", []))
        if (own and not isinstance(layer.call, _SplitCall)
                and not getattr(layer, "_non_trainable_variables", [])
                and not any(sub.variables for sub in getattr(layer, "_layers", []))
                and all(len(v.shape) >= 1 for v in own)):
            out.append(layer)
    return out


def shard_model(model, engine, rank: int, n: int, collectives=None,
                broadcast: bool = True) -> list:
    """Splits the model's leaf layers across the workers, in place (see the module).

    Every worker must call it at the same point, on the same built model.

    Args:
        model: A built Keras model (its variables exist).
        engine: The engine's collectives (`all_gather`, `reduce_rows`, `all_sum`).
        rank: This worker's rank.
        n: Data-parallel workers.
        collectives: The engine's host collectives (a backup's and a final save's
            reads of whole values go through them).
        broadcast: Rank 0's initial values are broadcast first (False: they are
            equal already, as MultiWorkerMirrored's variables are).

    Returns:
        The split variables.
    """
    import numpy as np
    import tensorflow as tf

    from tfdist.zero.optimizer import _outside_strategy

    split = []
    split_state = Split(collectives, n, rank)
    for layer in split_layers(model):
        variables = list(layer._trainable_variables)
        for v in variables:
            value = np.asarray(v.numpy())
            if collectives is not None and broadcast:
                (value,) = collectives.broadcast([value], 0)
            total = value.shape[0]
            start, stop, per = partition.row_share(total, n, rank)
            mine = np.zeros((per, *value.shape[1:]), value.dtype)
            mine[:stop - start] = value[start:stop]
            del value
            with _outside_strategy():  # this worker's rows (multi_worker would mirror them)
                storage = tf.Variable(mine, trainable=v.trainable, name=v.name)
            v._value = storage
            v._shape = tuple(mine.shape)
            v._ndim = len(v._shape)
            setattr(v, ROWS, (start, stop, per, total))
            v._tfdist_split = split_state
            split.append(v)
        layer.call = _SplitCall(layer, variables, engine, rank, n)
    return split
