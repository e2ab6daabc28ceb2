"""Optimizer-state sharding arithmetic (`tfdist.zero.partition`) and the option's checks."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfdist import cluster, config, strategies
from tfdist.errors import ConfigError
from tfdist.zero import partition


def test_largest_first_to_the_least_loaded_rank():
    # 100 -> 0, 60 -> 1, 50 -> 1 (60 < 100), 10 -> 0 (100 < 110), 10 -> 0 (tie at 110: rank 0)
    assert partition.owners([10, 100, 50, 60, 10], 2) == [0, 0, 1, 1, 0]
    assert partition.owned_bytes([10, 100, 50, 60, 10], 2) == [120, 110]


def test_one_rank_owns_everything_and_empty_lists_are_fine():
    assert partition.owners([3, 1, 2], 1) == [0, 0, 0]
    assert partition.owners([], 4) == []


def test_more_ranks_than_variables_leaves_some_ranks_without_state():
    assert partition.owners([5, 7], 4) == [1, 0]


@pytest.mark.parametrize("n, sizes", [(0, [1]), (2, [1, -1])])
def test_bad_arguments_are_refused(n, sizes):
    with pytest.raises(ValueError):
        partition.owners(sizes, n)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 10**6), max_size=40), st.integers(1, 9))
def test_every_variable_has_one_owner_and_the_split_is_balanced(sizes, n):
    owner = partition.owners(sizes, n)
    assert len(owner) == len(sizes) and all(0 <= o < n for o in owner)
    load = partition.owned_bytes(sizes, n)
    assert sum(load) == sum(sizes)
    # Greedy largest-first: no rank exceeds the mean by more than one variable.
    assert max(load) <= sum(sizes) / n + max(sizes, default=0)
    assert partition.owners(list(sizes), n) == owner  # deterministic


def test_rounds_pair_each_ranks_kth_largest_variable():
    sizes = [10, 100, 50, 60, 10]
    owner = partition.owners(sizes, 2)  # [0, 0, 1, 1, 0]
    assert partition.rounds(sizes, owner, 2) == [[1, 3], [0, 2], [4, None]]
    assert partition.rounds([], [], 3) == []


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 10**6), max_size=30), st.integers(1, 6))
def test_rounds_hold_every_variable_once_with_its_owner(sizes, n):
    owner = partition.owners(sizes, n)
    seen = []
    for members in partition.rounds(sizes, owner, n):
        assert len(members) == n
        for rank, i in enumerate(members):
            if i is not None:
                assert owner[i] == rank
                seen.append(i)
    assert sorted(seen) == list(range(len(sizes)))


def test_row_chunks_cover_the_rows_in_pieces_of_at_most_the_limit():
    assert partition.row_chunks((4096, 4096), 4 << 20) == [
        (0, 1024), (1024, 2048), (2048, 3072), (3072, 4096)]
    assert partition.row_chunks((10,), 4) == [(0, 4), (4, 8), (8, 10)]
    assert partition.row_chunks((3, 1000), 10) == [(0, 1), (1, 2), (2, 3)]  # one row at least
    assert partition.row_chunks((64, 64), 4096) == [None]  # one piece: the whole variable
    assert partition.row_chunks((), 4) == [None]


def test_column_chunks_cover_the_columns_in_order_in_pieces_of_at_most_the_limit():
    assert partition.column_chunks(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert partition.column_chunks(8 << 20, 1 << 20) == [(a, a + (1 << 20))
                                                          for a in range(0, 8 << 20, 1 << 20)]
    assert partition.column_chunks(5, 100) == [(0, 5)]
    assert partition.column_chunks(0, 4) == [(0, 0)]
    assert partition.column_chunks(3, 0) == [(0, 1), (1, 2), (2, 3)]  # one column at least


def _info():
    return cluster.detect({})


@pytest.mark.parametrize("strategy", ["shm", "multi_worker", "horovod"])
def test_the_option_applies_to_data_parallel_engines(strategy):
    cfg = config.merge({}, ["--strategy", strategy, "--shard-optimizer-state"], "recipe r")
    config.check_strategy(cfg, strategy, strategies.possible_names(strategy, _info(), None))
    assert cfg.typed.adapter.shard_optimizer_state is True


@pytest.mark.parametrize("strategy", ["single", "mirrored", "model_parallel", "pipeline",
                                      "parameter_server"])
def test_the_option_is_refused_elsewhere_with_one_line(strategy):
    cfg = config.merge({}, ["--strategy", strategy, "--shard-optimizer-state"], "recipe r")
    with pytest.raises(ConfigError) as e:
        config.check_strategy(cfg, strategy, strategies.possible_names(strategy, _info(), None))
    assert "--shard-optimizer-state applies only to --strategy" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("level", ["optimizer", "gradients"])
@pytest.mark.parametrize("strategy", ["shm", "horovod", "multi_worker"])
@pytest.mark.parametrize("optimizer", ["lamb", "adafactor", "muon"])
def test_optimizers_that_read_a_whole_weight_are_taken_as_owners_hold_whole_ones(
        optimizer, strategy, level):
    cfg = config.merge({}, ["--strategy", strategy, "--shard", level, "--optimizer",
                            optimizer], "recipe r")
    strategies.REGISTRY[strategy].check_config(cfg.typed, _info())
    assert partition.level(cfg.typed.adapter) == level


@pytest.mark.parametrize("strategy", ["shm", "horovod", "multi_worker"])
def test_gradient_compression_is_refused_at_shard_gradients_with_one_line(strategy):
    cfg = config.merge({}, ["--strategy", strategy, "--shard", "gradients",
                            "--grad-compression", "bf16"], "recipe r")
    with pytest.raises(ConfigError, match="--shard gradients reduce-scatters") as e:
        strategies.REGISTRY[strategy].check_config(cfg.typed, _info())
    assert "Received: --grad-compression bf16" in str(e.value) and "\n" not in str(e.value)
    ok = config.merge({}, ["--strategy", strategy, "--shard", "optimizer",
                           "--grad-compression", "bf16"], "recipe r")
    strategies.REGISTRY[strategy].check_config(ok.typed, _info())


@pytest.mark.parametrize("argv, level", [
    ([], "none"), (["--shard-optimizer-state"], "optimizer"), (["--shard", "optimizer"],
                                                              "optimizer"),
    (["--shard", "gradients"], "gradients"),
    (["--shard", "gradients", "--shard-optimizer-state"], "gradients"),  # includes it
])
def test_the_level_is_shard_or_the_spelled_out_optimizer_level(argv, level):
    cfg = config.merge({}, ["--strategy", "shm", *argv], "recipe r")
    assert partition.level(cfg.typed.adapter) == level
    assert level in partition.LEVELS


def test_an_unknown_level_is_refused():
    with pytest.raises(ConfigError, match="parameterz"):
        config.merge({}, ["--strategy", "shm", "--shard", "parameterz"], "recipe r")


def test_setup_takes_the_keyword():
    cfg = config.for_script("shm", {"shard_optimizer_state": True})
    assert cfg.typed.adapter.shard_optimizer_state is True
    cfg = config.for_script("multi_worker", {"shard": "gradients"})
    assert partition.level(cfg.typed.adapter) == "gradients"
    with pytest.raises(ConfigError):
        config.for_script("shm", {"shard_optimizer_state": "maybe"})


def test_each_worker_says_what_it_will_hold():
    mib = 1 << 20
    sizes = [8 * mib, 4 * mib, 4 * mib]  # worker 0 owns the 8, worker 1 the two 4s
    line = partition.holdings(sizes, 2, 1, "gradients", 16 * mib)
    assert line == ("tfdist: worker 1 of 2 (--shard gradients) holds every weight (16.0 MiB, "
                    "the largest 8.0 MiB), the optimizer state of its 2 of 3 variables "
                    "(16.0 MiB), and the reduced gradients of its 2 of 3 variables (8.0 MiB "
                    "of 16.0 MiB)")
    assert partition.holdings(sizes, 2, 0, "optimizer", 0).endswith(
        "state of its 1 of 3 variables (0 B), and every reduced gradient (16.0 MiB)")
    assert "(3.0 KiB, the largest 2.0 KiB)" in partition.holdings([2048, 1024], 2, 0,
                                                                   "optimizer", 0)
