"""Batch, shard and learning-rate arithmetic (pure), and the tf.data wrapper."""

import math

import numpy as np
import pytest

from tfdist import data
from tfdist.errors import ConfigError


def test_per_replica_batch_size():
    assert data.per_replica_batch_size(64, 2) == 32
    assert data.per_replica_batch_size(64, 1) == 64


def test_indivisible_batch_says_what_to_use():
    with pytest.raises(ConfigError, match=r"global_batch_size=100 is not divisible by "
                                          r"num_replicas=3\. Use a multiple of 3, e\.g\. "
                                          r"--global-batch-size 99 or 102"):
        data.per_replica_batch_size(100, 3)
    with pytest.raises(ConfigError, match="must be >= 1"):
        data.per_replica_batch_size(0, 2)


def test_scale_learning_rate():
    assert data.scale_learning_rate(0.1, 256, 64, "linear") == pytest.approx(0.4)
    assert data.scale_learning_rate(0.1, 256, 64, "sqrt") == pytest.approx(0.2)
    assert data.scale_learning_rate(0.1, 256, 64, "none") == pytest.approx(0.1)
    assert data.scale_learning_rate(0.1, 32, 64, "sqrt") == pytest.approx(0.1 / math.sqrt(2))
    with pytest.raises(ConfigError, match=r"Unknown learning-rate scaling rule 'cubic'"):
        data.scale_learning_rate(0.1, 2, 1, "cubic")


@pytest.mark.parametrize("files, workers, policy", [
    (0, 2, "DATA"), (1, 2, "DATA"), (2, 2, "FILE"), (8, 2, "FILE"), (8, 1, "DATA")])
def test_choose_shard_policy(files, workers, policy):
    assert data.choose_shard_policy(files, workers) == policy


def test_shard_indices_partition_the_data():
    shards = [list(data.shard_indices(10, 3, i)) for i in range(3)]
    assert shards == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert sorted(sum(shards, [])) == list(range(10))
    with pytest.raises(ConfigError, match="index=3, num_shards=3"):
        data.shard_indices(10, 3, 3)


def test_shard_matches_shard_indices():
    import tensorflow as tf

    ds = tf.data.Dataset.range(10)
    got = [int(v) for v in data.shard(ds, 3, 1)]
    assert got == list(data.shard_indices(10, 3, 1))


def test_prepare_batches_globally_and_sets_policy(tmp_path):
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((np.arange(10.0), np.arange(10)))
    train = data.prepare(ds, 4, num_workers=2, training=True)
    assert [b[0].shape[0] for b in train] == [4, 4]  # remainder dropped
    test = data.prepare(ds, 4, num_workers=2, training=False)
    assert [b[0].shape[0] for b in test] == [4, 4, 2]
    policy = train.options().experimental_distribute.auto_shard_policy
    assert policy == tf.data.experimental.AutoShardPolicy.DATA
    filed = data.prepare(data.Source(ds, num_files=4), 4, num_workers=2)
    assert (filed.options().experimental_distribute.auto_shard_policy
            == tf.data.experimental.AutoShardPolicy.FILE)


def test_shuffle_is_the_same_on_every_worker():
    import tensorflow as tf

    ds = tf.data.Dataset.range(20)
    a = [list(b.numpy()) for b in data.prepare(ds, 5, shuffle_buffer=20, seed=3)]
    b = [list(b.numpy()) for b in data.prepare(ds, 5, shuffle_buffer=20, seed=3)]
    assert a == b and a != [list(range(i, i + 5)) for i in range(0, 20, 5)]


def test_tfrecord_files(tmp_path):
    with pytest.raises(ConfigError, match="is not a directory"):
        data.tfrecord_files(str(tmp_path / "nope"), "train")
    with pytest.raises(ConfigError, match="has no 'train-\\*.tfrecord' files"):
        data.tfrecord_files(str(tmp_path), "train")
    for name in ("train-1.tfrecord", "train-0.tfrecord", "test-0.tfrecord"):
        (tmp_path / name).write_bytes(b"")
    assert [p.rsplit("/", 1)[1] for p in data.tfrecord_files(str(tmp_path), "train")] == [
        "train-0.tfrecord", "train-1.tfrecord"]


def test_shard_by_keeps_the_structure_of_each_example():
    import collections

    import tensorflow as tf

    pair = collections.namedtuple("Pair", "x y")
    n = tf.range(16)
    for examples, shape in (((n, -n), (8, -8)), ({"a": n, "b": -n}, {"a": 8, "b": -8}),
                            (pair(n, -n), pair(8, -8)), ((n,), (8,))):
        ds = data.prepare(tf.data.Dataset.from_tensor_slices(examples), 8, shard_by=(2, 1))
        first = next(iter(ds))
        assert type(first) is type(shape) and len(first) == len(shape)
        for got, start in zip(tf.nest.flatten(first), tf.nest.flatten(shape)):
            sign = 1 if start > 0 else -1  # rows 4..7 of the first global batch of 8
            np.testing.assert_array_equal(got.numpy(), sign * np.arange(4, 8))


def test_shard_by_rank_slices_every_global_batch_evenly():
    import tensorflow as tf

    ds = tf.data.Dataset.range(23)  # 2 full global batches of 8, 7 left over
    shards = [list(data.prepare(ds, 8, shard_by=(4, i), training=True).as_numpy_iterator())
              for i in range(4)]
    assert all(len(s) == 2 for s in shards)  # every rank runs the same steps
    # The per-replica batch dimension is static, as an unsharded pipeline's is.
    assert data.prepare(ds, 8, shard_by=(4, 1)).element_spec.shape.as_list() == [2]
    for step in range(2):
        together = np.concatenate([s[step] for s in shards])
        np.testing.assert_array_equal(together, np.arange(8 * step, 8 * step + 8))
    with pytest.raises(ConfigError, match="shard_by needs training=True"):
        data.prepare(ds, 8, shard_by=(4, 0), training=False)
    with pytest.raises(ConfigError, match="not divisible by num_replicas=3"):
        data.prepare(ds, 8, shard_by=(3, 0))


@pytest.mark.parametrize("num_files", [4, 0])
def test_every_example_is_read_exactly_once_per_epoch_across_two_workers(tmp_path, num_files):
    """What each worker reads after TensorFlow's auto-sharding of `prepare`'s dataset
    (the same `auto_shard_dataset` MultiWorkerMirroredStrategy applies): by file with 4
    TFRecord files for 2 workers, by batch for in-memory data. Together the workers
    read every example of the epoch once."""
    import tensorflow as tf
    from tensorflow.python.distribute import input_ops

    ids = list(range(40))
    if num_files:
        paths = []
        for f in range(num_files):
            path = str(tmp_path / f"train-{f}.tfrecord")
            with tf.io.TFRecordWriter(path) as w:
                for i in ids[f::num_files]:
                    w.write(tf.train.Example(features=tf.train.Features(feature={
                        "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))
                    })).SerializeToString())
            paths.append(path)
        spec = {"id": tf.io.FixedLenFeature([], tf.int64)}
        ds = tf.data.TFRecordDataset(paths).map(
            lambda r: (tf.io.parse_single_example(r, spec)["id"],) * 2)
    else:
        ds = tf.data.Dataset.from_tensor_slices((ids, ids))
    batched = data.prepare(data.Source(ds, num_files), 4, num_workers=2, training=True)
    policy = batched.options().experimental_distribute.auto_shard_policy
    assert policy == (tf.data.experimental.AutoShardPolicy.FILE if num_files
                      else tf.data.experimental.AutoShardPolicy.DATA)
    seen = []
    for worker in range(2):
        shard = input_ops.auto_shard_dataset(batched, 2, worker, 2)
        mine = [int(i) for x, _ in shard for i in x.numpy()]
        assert mine, f"worker {worker} read nothing"
        seen.append(mine)
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == ids


def test_data_smaller_than_one_global_batch_is_one_clear_error():
    import tensorflow as tf

    from tfdist.data import check_full_batch, prepare

    ds = tf.data.Dataset.range(10)
    check_full_batch(prepare(ds, 10), 10)  # one full batch: fine
    with pytest.raises(ConfigError, match=r"has 10 examples, fewer than one global batch of "
                                          r"16 .*--global-batch-size \(at most 10\)"):
        check_full_batch(prepare(ds, 16), 16, lambda: 10)
    # Cardinality unknown (a filter): one batch is read to tell.
    unknown = ds.filter(lambda x: x < 100)
    check_full_batch(prepare(unknown, 10), 10)
    with pytest.raises(ConfigError, match=r"has fewer examples than one global batch of 11"):
        check_full_batch(prepare(unknown, 11), 11)
    check_full_batch(prepare(ds, 5, repeat=True), 5)  # repeating for ever: fine
    with pytest.raises(ConfigError):  # repeating an empty pass: the hang it prevents
        check_full_batch(prepare(ds, 16, repeat=True), 16)
