"""Each variable's update as soon as its gradient exists, so gradients die early.

Keras applies a batch's gradients in one `optimizer.apply` after the whole
backward pass. Nothing in the graph makes a stage's backward wait for the
updates, so the executor is free to compute many of the stage's gradients
before it gets to their updates, all alive at once (#29).

`updates_as_gradients_come` adds control edges to a traced train step: on
each device, the op making the next gradient (in the order the backward
makes them) waits for the previous gradient's update. Only the order of execution
changes: every op computes what it did, so the math is the same to the bit.
An edge that would close a cycle is not added: under global-norm clipping or
a loss scale's finite check every update needs every gradient, and nothing
can run earlier.
"""

from __future__ import annotations


def ancestors(ops) -> set:
    """Every op `ops` wait for (inputs and control inputs, transitively).

    Args:
        ops: Graph operations.

    Returns:
        The set of operations they depend on, not counting themselves.
    """
    seen, stack = set(), list(ops)
    while stack:
        op = stack.pop()
        for parent in [t.op for t in op.inputs] + list(op.control_inputs):
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen


def updates_as_gradients_come(graph, pairs, update_ops: dict) -> int:
    """Makes each device's next gradient wait for the previous gradient's update there.

    Chained per variable device: a stage's devices (tensor-parallel shards)
    and the stages keep running side by side.

    Args:
        graph: The traced train step's graph, after `optimizer.apply`.
        pairs: (gradient, tf.Variable) of every variable.
        update_ops: id(tf.Variable) -> the ops of its update
            (`placed_updates`; a variable updated elsewhere, say inside a
            loss scale's cond, has none here).

    Returns:
        How many gradients were made to wait for an update.
    """
    by_device = {}
    for g, v in pairs:
        if g is not None and hasattr(g, "op") and g.op.graph is graph:
            by_device.setdefault(v.device, []).append((g, update_ops.get(id(v))))
    added = 0
    for made in by_device.values():
        # The order the backward made them in: the tape creates ops as it goes.
        made.sort(key=lambda gu: gu[0].op._id)
        for (_, ops), (nxt, _) in zip(made, made[1:]):
            # Its assignments: the update is done when they are.
            writes = [op for op in ops or () if op.graph is graph and op._is_stateful
                      and not op.outputs]
            if not writes or nxt.op._is_stateful or nxt.op in ancestors(writes):
                continue  # no update here, or it needs the next gradient as well
            for op in writes:
                nxt.op._add_control_input(op)
            added += 1
    return added
