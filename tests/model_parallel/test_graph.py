"""Where a model can be cut into stages (pure, on `Node` tuples; one Keras model at the end)."""

import pytest

from tfdist.errors import ConfigError
from tfdist.model_parallel.graph import (Graph, Node, SplitError, balanced_cuts,
                                         stages_from_groups)


def chain(names, weighted):
    nodes = tuple(Node(n, (i,), (i + 1,), bool(w)) for i, (n, w) in
                  enumerate(zip(names, weighted)))
    return Graph(nodes, (0,), (len(names),))


def residual_blocks(blocks):
    """x -> [norm -> dense -> add(x, .)] * blocks -> out: tensors are ints."""
    nodes, t, stream = [], 1, 0
    for b in range(blocks):
        nodes.append(Node(f"norm{b}", (stream,), (t,), True))
        nodes.append(Node(f"dense{b}", (t,), (t + 1,), True))
        nodes.append(Node(f"add{b}", (stream, t + 1), (t + 2,), False))
        stream, t = t + 2, t + 3
    nodes.append(Node("out", (stream,), (t,), True))
    return Graph(tuple(nodes), (0,), (t,))


def test_a_chain_splits_evenly_earlier_stages_taking_the_remainder():
    g = chain(["h0", "h1", "h2", "logits"], [1, 1, 1, 1])
    assert g.candidate_cuts() == [1, 2, 3]
    assert balanced_cuts(g, 2) == [2] and balanced_cuts(g, 3) == [2, 3]
    assert balanced_cuts(g, 1) == []


def test_balance_time_moves_the_cuts_among_the_same_candidates():
    # Equal parameters, but the last layer takes as long as the other three (--balance time).
    g = residual_blocks(2)
    assert balanced_cuts(g, 2) == [3]
    timed = g.weighed([1, 1, 1, 1, 1, 1, 30])
    assert balanced_cuts(timed, 2) == [6]  # the slow layer alone
    assert timed.candidate_cuts() == g.candidate_cuts()
    assert [n.layer for n in timed.nodes] == [n.layer for n in g.nodes]
    with pytest.raises(ConfigError, match="2 layer cost"):
        g.weighed([1, 2])


def test_stages_are_balanced_by_parameters_not_by_layers():
    # A large first layer and three small ones: two layers a stage would put
    # 1020 parameters on stage 0 and 20 on stage 1.
    nodes = tuple(Node(n, (i,), (i + 1,), True, p) for i, (n, p) in
                  enumerate(zip(["embed", "a", "b", "c"], [1000, 10, 10, 10])))
    g = Graph(nodes, (0,), (4,))
    assert balanced_cuts(g, 2) == [1]
    assert g.cost(0, 1) == 1000 and g.cost(1, 4) == 30
    # 4 + 1 + 1 + 1 + 1: three stages of 4, 2 and 2, not 4, 3 and 1 (the largest as
    # small as can be, then the next largest).
    g = Graph(tuple(Node(str(i), (i,), (i + 1,), True, p) for i, p in
                    enumerate([4, 1, 1, 1, 1])), (0,), (5,))
    assert balanced_cuts(g, 3) == [1, 3]


def test_weightless_layers_stay_with_the_layer_before_them():
    g = chain(["embed", "pool", "d1", "drop", "out"], [1, 0, 1, 0, 1])
    assert g.candidate_cuts() == [2, 4]  # before d1 and before out
    assert balanced_cuts(g, 2) == [4]  # embed, pool, d1, drop | out
    # Leading weightless layers join the first stage.
    assert balanced_cuts(chain(["flat", "a", "b"], [0, 1, 1]), 2) == [2]
    with pytest.raises(ConfigError, match=r"Cannot split model into 2 stages"):
        balanced_cuts(chain(["a", "drop"], [1, 0]), 2)


def test_residual_blocks_are_cut_between_blocks_only():
    g = residual_blocks(3)
    # Inside a block the stream and the branch cross (2 tensors); between blocks, 1.
    assert [len(g.crossing(k)) for k in range(1, len(g.nodes))] == [2, 2, 1, 2, 2, 1, 2, 2, 1]
    assert g.candidate_cuts() == [3, 6, 9]
    assert balanced_cuts(g, 2) == [6]  # blocks 0-1 | block 2 and out


def test_an_encoder_output_crosses_into_every_decoder_stage():
    # enc: x -> e1 -> e2; dec: y -> d1(., enc) -> d2(., enc) -> out
    nodes = (Node("e1", (0,), (2,), True), Node("e2", (2,), (3,), True),
             Node("d1", (1, 3), (4,), True), Node("d2", (4, 3), (5,), True),
             Node("out", (5,), (6,), True))
    g = Graph(nodes, (0, 1), (6,))
    assert g.crossing(3) == [3, 4]  # the encoder output beside the decoder stream
    assert g.crossing(1) == [1, 2]  # the decoder's input tokens wait through the encoder
    assert balanced_cuts(g, 2) == [3]


def test_a_shared_layer_is_never_cut_between_its_calls():
    nodes = (Node("emb", (0,), (1,), True), Node("d", (1,), (2,), True),
             Node("emb", (2,), (3,), True), Node("out", (3,), (4,), True))
    g = Graph(nodes, (0,), (4,))
    assert g.candidate_cuts() == [3]


def test_more_stages_than_cuts_is_one_clear_error():
    with pytest.raises(ConfigError, match=r"Cannot split model into 4 stages: it has 2 "
                                          r"place\(s\).*at most 3 stages. Use --devices 3"):
        balanced_cuts(chain(["a", "b", "c"], [1, 1, 1]), 4)
    # The numbers travel as fields: stages across processes word their own advice.
    with pytest.raises(SplitError) as e:
        balanced_cuts(chain(["a", "b", "c"], [1, 1, 1]), 4)
    assert (e.value.stages, e.value.most) == (4, 3)


def test_placement_groups_become_cuts_and_may_leave_out_weightless_layers():
    g = chain(["embed", "pool", "d1", "drop", "out"], [1, 0, 1, 0, 1])
    assert stages_from_groups(g, [["embed"], ["d1", "out"]]) == [2]
    with pytest.raises(ConfigError, match=r"leaves layers unplaced: \['d1'\]"):
        stages_from_groups(g, [["embed"], ["out"]])


def test_from_keras_reads_a_functional_model_in_data_flow_order():
    import keras

    from tfdist.model_parallel.graph import from_keras

    x = keras.Input((4,))
    h = keras.layers.Dense(4, name="a")(x)
    out = keras.layers.Dense(2, name="c")(keras.layers.Add(name="b")([x, h]))
    g = from_keras(keras.Model(x, out))
    assert [n.layer for n in g.nodes] == ["a", "b", "c"]
    assert [n.weighted for n in g.nodes] == [True, False, True]
    assert [n.params for n in g.nodes] == [4 * 4 + 4, 0, 4 * 2 + 2]
    assert g.candidate_cuts() == [2] and len(g.crossing(1)) == 2


def test_from_keras_counts_a_shared_layers_parameters_once():
    import keras

    from tfdist.model_parallel.graph import from_keras

    x = keras.Input((3,))
    shared = keras.layers.Dense(3, name="shared")
    out = keras.layers.Dense(1, name="out")(shared(shared(x)))
    g = from_keras(keras.Model(x, out))
    assert [(n.layer, n.weighted, n.params) for n in g.nodes] == [
        ("shared", True, 12), ("shared", True, 0), ("out", True, 4)]
