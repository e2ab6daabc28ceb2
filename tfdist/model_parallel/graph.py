"""Where a model can be cut into pipeline stages: its layer calls in order, and what crosses.

A functional Keras model is a graph of layer calls (nodes). Taken in an order
that respects the data flow, cutting it between two nodes splits it into a
front and a back; the tensors that *cross* the cut are those the front makes
(or the model takes as input) and the back still reads (or returns). A stage
is then a contiguous run of nodes: it takes the tensors crossing its first
cut and hands on those crossing its last one. Any cut trains correctly; the
good ones cross least. In a stack of blocks with residual connections that
is between blocks (a residual crossing too only inside a block); in an
encoder-decoder, the encoder output crosses every decoder cut, beside the
decoder's own stream.

The arithmetic here is pure Python on `Node` tuples, tested without
TensorFlow; `from_keras` reads them off a built Keras model.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from tfdist import parameters
from tfdist.errors import ConfigError


class SplitError(ConfigError):
    """The model cannot be cut into as many stages as asked.

    The message advises a one-process run (--devices, --placement); a caller
    that places stages otherwise (one per process) words its own advice from
    the fields.

    Args:
        message: What happened and what to do.
        stages: The stages asked for.
        most: The most stages the model can be cut into.
    """

    def __init__(self, message: str, stages: int, most: int):
        super().__init__(message)
        self.stages, self.most = stages, most


@dataclasses.dataclass(frozen=True)
class Node:
    """One layer call of the model.

    Attributes:
        layer: The layer's name (a layer called twice has two nodes).
        inputs: Ids of the tensors it reads.
        outputs: Ids of the tensors it makes.
        weighted: Whether the layer has weights.
        params: How many parameters this call adds to its stage: the layer's
            weights at its first call, 0 at a shared layer's later calls.
            None counts a weighted layer as 1 (graphs written by hand).
    """

    layer: str
    inputs: tuple
    outputs: tuple
    weighted: bool
    params: int | None = None

    @property
    def cost(self) -> int:
        """What this call weighs in `balanced_cuts`: its parameters."""
        return int(self.weighted) if self.params is None else self.params


@dataclasses.dataclass(frozen=True)
class Graph:
    """A model's nodes in an order that respects the data flow.

    Attributes:
        nodes: The layer calls.
        inputs: Ids of the model's input tensors.
        outputs: Ids of the model's output tensors.
    """

    nodes: tuple
    inputs: tuple
    outputs: tuple

    def crossing(self, k: int) -> list:
        """Ids of the tensors crossing a cut before node `k` (0: the inputs; n: the outputs)."""
        made = list(self.inputs) + [t for node in self.nodes[:k] for t in node.outputs]
        needed = {t for node in self.nodes[k:] for t in node.inputs} | set(self.outputs)
        seen, out = set(), []
        for t in made:  # in the order they are made: the same on every process
            if t in needed and t not in seen:
                seen.add(t)
                out.append(t)
        return out

    def layer_span(self) -> dict[str, tuple[int, int]]:
        """layer name -> (first node, last node) of its calls."""
        span: dict[str, tuple[int, int]] = {}
        for i, node in enumerate(self.nodes):
            first, _ = span.get(node.layer, (i, i))
            span[node.layer] = (first, i)
        return span

    def candidate_cuts(self) -> list[int]:
        """Cuts worth making: just before a layer with weights (a layer without
        weights stays with the one before it), between two calls of no shared
        layer, and not inside a block.

        Inside a block more tensors cross than somewhere before it and
        somewhere after it (a residual beside the branch); a cut with fewer
        crossing tensors on one side at least is between blocks. Tensors that
        cross every cut of a stretch (an encoder's output, a decoder's input
        tokens) count everywhere alike, so they do not hide the blocks.
        """
        n = len(self.nodes)
        counts = [len(self.crossing(k)) for k in range(n + 1)]
        span = self.layer_span()
        shared = [(a, b) for a, b in span.values() if b > a]
        return [k for k in range(1, n) if self.nodes[k].weighted
                and not any(a < k <= b for a, b in shared)
                and not (min(counts[:k]) < counts[k] and min(counts[k + 1:]) < counts[k])]

    def weighted_count(self, start: int, end: int) -> int:
        """Layers with weights among nodes [start, end)."""
        return sum(1 for node in self.nodes[start:end] if node.weighted)

    def cost(self, start: int, end: int) -> int:
        """Parameters of nodes [start, end) (`Node.cost`)."""
        return sum(node.cost for node in self.nodes[start:end])

    def weighed(self, costs: Sequence[int]) -> "Graph":
        """This graph with each node weighing `costs[k]` in `balanced_cuts` instead of
        its parameters (`--balance time`: measured nanoseconds). The candidate cuts
        stay the same: only where among them the cuts fall changes.

        Raises:
            ConfigError: when `costs` does not give one cost per node.
        """
        if len(costs) != len(self.nodes):
            raise ConfigError(f"Got {len(costs)} layer cost(s) for {len(self.nodes)} layer "
                              "calls; the profile pass measures each call once.")
        return dataclasses.replace(self, nodes=tuple(
            dataclasses.replace(node, params=max(int(c), 0))
            for node, c in zip(self.nodes, costs)))


def balanced_cuts(graph: Graph, stages: int) -> list[int]:
    """Pure function: `stages - 1` candidate cuts that spread the parameters evenly.

    Minimises the largest stage in parameters (what a stage process must hold:
    its weights, their gradients and optimizer slots scale with them), then the
    next largest, and so on; among splits with the same sizes, earlier stages
    take the remainder, as `plan.even_split` does. Every stage holds at least
    one layer with weights.

    Raises:
        ConfigError: when the model has fewer places to cut than stages need.
    """
    if stages < 1:
        raise ConfigError(f"Need at least one stage. Received: {stages}.")
    cuts = graph.candidate_cuts()
    if stages - 1 > len(cuts):
        weighted = graph.weighted_count(0, len(graph.nodes))
        raise SplitError(
            f"Cannot split model into {stages} stages: it has {len(cuts)} place(s) to cut "
            f"between blocks ({weighted} layers with weights), so at most {len(cuts) + 1} "
            f"stages. Use --devices {len(cuts) + 1} or fewer, or name the stages with "
            "--placement.", stages, len(cuts) + 1)
    points = [0, *cuts, len(graph.nodes)]
    last = len(points) - 1
    # best[j]: the best split of nodes [0, points[j]) into s stages so far, as
    # (stage sizes largest first, stage sizes negated, the cut indexes): min()
    # picks the smallest largest stage, then the smallest next one, then the
    # larger earlier stages. (Adding the same stages to two splits keeps their
    # order, so keeping one split per j is exact.)
    best = {0: ((), (), ())}
    for s in range(1, stages + 1):
        row = {}
        for j in (range(1, last + 1) if s < stages else (last,)):
            options = []
            for i, (_, sizes, chosen) in best.items():
                if i >= j or not graph.weighted_count(points[i], points[j]):
                    continue
                size = graph.cost(points[i], points[j])
                ordered = tuple(sorted([*(-x for x in sizes), size], reverse=True))
                options.append((ordered, sizes + (-size,), chosen + (i,)))
            if options:
                row[j] = min(options)
        best = row
    if last not in best:
        raise ConfigError(f"Cannot split the model into {stages} stages that each hold a "
                          "layer with weights. Use fewer --devices.")
    return [points[i] for i in best[last][2][1:]]


def stages_from_groups(graph: Graph, groups: Sequence[Sequence[str]]) -> list[int]:
    """Pure function: the cuts that `--placement` layer groups name (groups in model order).

    Layers a group does not name go with the layer before them when they have
    no weights; every layer with weights must be named.

    Raises:
        ConfigError: for a layer named out of order, unnamed, or unknown.
    """
    from tfdist.model_parallel import plan

    layers = list(dict.fromkeys(node.layer for node in graph.nodes))
    weightless = {node.layer for node in graph.nodes if not node.weighted}
    full = plan.attach_weightless([(str(i), list(g)) for i, g in enumerate(groups)], layers,
                                  weightless)
    return cuts_of(graph, {name: i for i, (_, names) in enumerate(full) for name in names})


def cuts_of(graph: Graph, stage_of: dict[str, int]) -> list[int]:
    """Pure function: the node positions where the stage changes, given each layer's stage.

    Raises:
        ConfigError: when a layer would run on an earlier stage than a layer it reads from.
    """
    cuts, current = [], 0
    for k, node in enumerate(graph.nodes):
        s = stage_of[node.layer]
        if s < current:
            raise ConfigError(f"Layer {node.layer!r} would run on an earlier stage than a layer "
                              "it reads from. Name the stages (--placement) in model order.")
        while current < s:
            cuts.append(k)
            current += 1
    return cuts


def from_keras(model, calls=None) -> Graph:
    """The `Graph` of a built functional or Sequential Keras model (ids: `id()` of tensors).

    `calls`: the model's `keras_nodes`, when the caller has them already.

    Raises:
        ConfigError: for a model that is not functional (a subclassed model).
    """
    functional = _functional(model)
    nodes, counted = [], set()
    for node in keras_nodes(model) if calls is None else calls:
        layer = node.operation
        params = 0 if id(layer) in counted else parameters.count(layer.weights)
        counted.add(id(layer))
        nodes.append(Node(layer.name, tuple(id(t) for t in node.input_tensors),
                          tuple(id(t) for t in node.outputs), bool(layer.weights), params))
    return Graph(tuple(nodes), tuple(id(t) for t in functional.inputs),
                 tuple(id(t) for t in functional.outputs))


def keras_nodes(model) -> list:
    """The Keras `Node` objects of the model's layer calls, in `from_keras`'s order.

    A data-flow order that follows one chain as far as it goes (the next node
    is the ready one that reads the newest tensor), so an encoder's layers
    all come before the decoder's instead of interleaving by depth, and cuts
    fall between whole blocks. It depends only on the graph, so a copy of the
    model (`clone_model`) gets the same order.
    """
    functional = _functional(model)
    base = [node for depth in sorted(functional._nodes_by_depth, reverse=True)
            for node in functional._nodes_by_depth[depth]
            if node.operation is not None and not node.is_input]
    made = {id(t): -1 for t in functional.inputs}  # tensor -> step it was made at
    order, left = [], list(base)
    while left:
        ready = [n for n in left if all(id(t) in made for t in n.input_tensors)]
        if not ready:  # pragma: no cover - Keras graphs are acyclic
            raise ConfigError(f"Model {model.name!r} has layer calls that never become ready.")
        newest = max(max((made[id(t)] for t in n.input_tensors), default=-1) for n in ready)
        node = next(n for n in ready
                    if max((made[id(t)] for t in n.input_tensors), default=-1) == newest)
        left.remove(node)
        for t in node.outputs:
            made[id(t)] = len(order)
        order.append(node)
    return order


def _functional(model):
    """The functional graph behind `model` (a Sequential's own); ConfigError for others."""
    import keras

    if isinstance(model, keras.Sequential):
        model = getattr(model, "_functional", None) or model
    if not hasattr(model, "_nodes_by_depth") or not getattr(model, "inputs", None):
        raise ConfigError(
            f"Splitting a model into stages needs a functional (or Sequential) Keras model "
            f"with an Input. Received {type(model).__name__} {model.name!r}. Build it with "
            "keras.Input(...) and layer calls, or use a data-parallel strategy.")
    return model


def dense_pairs(graph, dense: set[str]) -> dict[str, str]:
    """Pure function: the feed-forward pairs among a model's Dense layers.

    A pair is a Dense called once whose output only one call reads, that of
    another Dense called once, which reads nothing else (and the output is
    not a model output). The first becomes column-parallel, the second
    row-parallel: between them each device keeps its slice of the hidden
    units. Pairs do not overlap (in Dense -> Dense -> Dense only the first
    two pair).

    Args:
        graph: A `tfdist.model_parallel.graph.Graph`.
        dense: Names of the layers that are plain `keras.layers.Dense`.

    Returns:
        layer name -> "column" or "row".
    """
    span = graph.layer_span()
    once = {name for name, (a, b) in span.items() if a == b and name in dense}
    readers: dict = {}
    for node in graph.nodes:
        for t in node.inputs:
            readers.setdefault(t, []).append(node)
    roles: dict[str, str] = {}
    for node in graph.nodes:
        if node.layer not in once or node.layer in roles or len(node.outputs) != 1:
            continue
        out = node.outputs[0]
        after = readers.get(out, [])
        if out in graph.outputs or len(after) != 1:
            continue
        nxt = after[0]
        if nxt.layer in once and nxt.layer not in roles and nxt.inputs == (out,):
            roles[node.layer], roles[nxt.layer] = "column", "row"
    return roles
