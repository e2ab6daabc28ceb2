"""Overlap buckets (`tfdist.buckets`, #31): the all-reduce's grouping of the gradients."""

from __future__ import annotations

import pytest

from tfdist.buckets import ENGINE_DEFAULT, bucket_bytes, overlap_buckets, resolve


def test_zero_is_one_bucket_in_the_models_order():
    assert overlap_buckets([4, 8, 16], 0) == [[0, 1, 2]]
    assert overlap_buckets([], 4) == []


def test_buckets_start_from_the_last_tensor_and_close_at_the_size():
    # Backward makes the last layer's gradient first: it is in the first bucket.
    assert overlap_buckets([10, 10, 10, 10, 10], 20) == [[3, 4], [1, 2], [0]]
    assert overlap_buckets([100, 1, 1, 100], 50) == [[3], [0, 1, 2]]
    assert overlap_buckets([1, 2, 3], 1 << 30) == [[0, 1, 2]]


@pytest.mark.parametrize("size", [1, 7, 64, 1000])
def test_every_tensor_is_reduced_once_and_each_closed_bucket_is_full(size):
    sizes = [(i * 37) % 101 + 1 for i in range(40)]
    buckets = overlap_buckets(sizes, size)
    assert sorted(i for b in buckets for i in b) == list(range(40))
    for b in buckets[:-1]:
        assert sum(sizes[i] for i in b) >= size
    firsts = [max(b) for b in buckets]
    assert firsts == sorted(firsts, reverse=True)  # reverse layer order


def test_megabytes_are_tensorflows_bytes_per_pack():
    assert bucket_bytes(4) == 4 << 20
    assert bucket_bytes(0.001) == 1048
    assert bucket_bytes(0) == 0


def test_the_default_is_each_engines_measured_size_and_other_negatives_are_refused():
    assert resolve(ENGINE_DEFAULT, "multi_worker") == 4.0
    assert resolve(ENGINE_DEFAULT, "shm") == 0.0
    assert resolve(2, "shm") == 2.0 and resolve(0, "multi_worker") == 0.0
    with pytest.raises(ValueError, match=r"Received: --bucket-mb -0.5"):
        resolve(-0.5, "shm")
