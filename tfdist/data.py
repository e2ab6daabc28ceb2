"""Batch and shard arithmetic, and the thin tf.data calls that use it.

One module for every strategy. The arithmetic is pure Python (tested without
a cluster); only `prepare`, `shard` and `tfrecord_files` touch tf.data.

Equality with single-device training: a dataset batched at the *global*
batch size with AutoShardPolicy.DATA is split by TensorFlow so that the
replicas of one step together see exactly the examples of one global batch,
the same examples one replica would see. FILE sharding (each worker reads its
own files) is faster for large data but changes which examples meet in a
batch, so it is chosen only when there are at least as many files as workers.
"""

from __future__ import annotations

import dataclasses
import math
import os

from tfdist.errors import ConfigError

SCALING_RULES = ("none", "linear", "sqrt")


def per_replica_batch_size(global_batch_size: int, num_replicas: int) -> int:
    """Splits a global batch evenly across replicas.

    Args:
        global_batch_size: Examples per optimizer step, all replicas together.
        num_replicas: Replicas in sync.

    Returns:
        Examples each replica processes per step.

    Raises:
        ConfigError: when the global batch does not divide evenly.
    """
    if global_batch_size < 1 or num_replicas < 1:
        raise ConfigError(f"global_batch_size and num_replicas must be >= 1. Received: "
                          f"global_batch_size={global_batch_size}, num_replicas={num_replicas}.")
    if global_batch_size % num_replicas:
        lo = global_batch_size - global_batch_size % num_replicas
        raise ConfigError(
            f"global_batch_size={global_batch_size} is not divisible by "
            f"num_replicas={num_replicas}. Use a multiple of {num_replicas}, "
            f"e.g. --global-batch-size {lo or num_replicas} or {lo + num_replicas}.")
    return global_batch_size // num_replicas


def scale_learning_rate(base_lr: float, global_batch_size: int, base_batch_size: int,
                        rule: str = "linear") -> float:
    """Scales a learning rate tuned at `base_batch_size` to `global_batch_size`.

    Args:
        base_lr: Learning rate that worked at `base_batch_size`.
        global_batch_size: The batch size now used.
        base_batch_size: The batch size `base_lr` was tuned for.
        rule: "linear" (Goyal et al. 2017), "sqrt" (Krizhevsky 2014; for
            adaptive optimizers), or "none".

    Returns:
        The scaled learning rate.

    Raises:
        ConfigError: for an unknown rule or non-positive batch sizes.
    """
    if rule not in SCALING_RULES:
        raise ConfigError(f"Unknown learning-rate scaling rule {rule!r}; valid: "
                          f"{list(SCALING_RULES)}.")
    if global_batch_size < 1 or base_batch_size < 1:
        raise ConfigError(f"batch sizes must be >= 1. Received: global_batch_size="
                          f"{global_batch_size}, base_batch_size={base_batch_size}.")
    ratio = global_batch_size / base_batch_size
    return base_lr * {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[rule]


def choose_shard_policy(num_files: int, num_workers: int) -> str:
    """Pure function: "FILE" when every worker can get a file, else "DATA".

    Args:
        num_files: Input files behind the dataset (0 for in-memory data).
        num_workers: Processes reading the data.
    """
    return "FILE" if num_files >= num_workers > 1 else "DATA"


def shard_indices(num_examples: int, num_shards: int, index: int) -> range:
    """Pure function: the example indices shard `index` takes (round robin).

    This is what `tf.data.Dataset.shard(num_shards, index)` selects.

    Raises:
        ConfigError: when `index` is not in [0, num_shards).
    """
    if num_shards < 1 or not 0 <= index < num_shards:
        raise ConfigError(f"shard index must be in [0, num_shards). Received: "
                          f"index={index}, num_shards={num_shards}.")
    return range(index, num_examples, num_shards)


@dataclasses.dataclass
class Source:
    """What a recipe hands over: unbatched examples, and how many files back them.

    Attributes:
        dataset: A `tf.data.Dataset` of unbatched (features, label) examples.
        num_files: Files the dataset reads (0 for in-memory data); decides
            the auto-shard policy.
    """

    dataset: object
    num_files: int = 0


def as_source(obj) -> Source:
    """A recipe's `build_dataset` result as a Source (a plain Dataset has no files)."""
    return obj if isinstance(obj, Source) else Source(dataset=obj)


def tfrecord_files(data_dir: str, split: str) -> list[str]:
    """Sorted TFRecord files for a split: `DATA_DIR/SPLIT-*.tfrecord`.

    Raises:
        ConfigError: when the directory has no such files.
    """
    if not os.path.isdir(data_dir):
        raise ConfigError(f"data_dir={data_dir!r} is not a directory. Pass the one that "
                          "holds the train-*.tfrecord and test-*.tfrecord files.")
    files = sorted(os.path.join(data_dir, f) for f in os.listdir(data_dir)
                   if f.startswith(f"{split}-") and f.endswith(".tfrecord"))
    if not files:
        raise ConfigError(f"data_dir={data_dir!r} has no '{split}-*.tfrecord' files. "
                          "Write them with the recipe's `write_tfrecords` helper.")
    return files


def shard(dataset, num_shards: int, index: int):
    """Explicit shard-by-index for paths that do not auto-shard (Horovod, PS).

    Keeps every `num_shards`-th element starting at `index`; call it before
    shuffling so that shards are disjoint.
    """
    shard_indices(0, num_shards, index)  # validates
    return dataset.shard(num_shards, index)


def _rows(spec, start: int, size: int):
    """A `Dataset.map` function keeping rows [start, start + size) of every tensor of a batch.

    `map` passes the parts of a plain tuple element (not a namedtuple) as
    separate arguments; `spec` (the element_spec) says whether to put them back.
    """
    import tensorflow as tf

    def cut(*parts):
        element = parts if type(spec) is tuple else parts[0]
        return tf.nest.map_structure(lambda t: t[start:start + size], element)

    return cut


def prepare(source, global_batch_size: int, *, num_workers: int = 1, training: bool = True,
            shuffle_buffer: int = 0, seed: int = 0, shard_by: tuple[int, int] | None = None,
            repeat: bool = False, skip_batches: int = 0):
    """Batches a recipe's examples at the global batch size for `fit`.

    Args:
        source: A `Source`, or a plain `tf.data.Dataset` of unbatched examples.
        global_batch_size: Examples per step across all replicas; TensorFlow
            splits each global batch among the replicas.
        num_workers: Processes reading data (decides FILE vs DATA sharding).
        training: Drop the last partial batch (so every step is a full global
            batch) and shuffle when `shuffle_buffer` > 0.
        shuffle_buffer: Shuffle buffer; the seed is the same on every worker,
            so every worker sees the same order before sharding.
        seed: Shuffle seed.
        shard_by: (num_shards, index) for processes TensorFlow does not
            distribute (Horovod ranks): each global batch is cut into
            `num_shards` equal slices and this process keeps slice `index`, so
            the shards of one step are together exactly the global batch, and
            every process runs the same number of steps.
        repeat: Repeat epochs forever (the caller sets steps_per_epoch). Each
            epoch is batched on its own, so no batch spans two epochs.
        skip_batches: Global batches to skip first: the data position of a
            resumed run. Replaying the seeded pipeline and skipping gives the
            resumed run exactly the batches the interrupted one would have seen.

    Returns:
        A batched `tf.data.Dataset` with its auto-shard policy set.
    """
    import tensorflow as tf

    source = as_source(source)
    ds = source.dataset
    if training and shuffle_buffer > 0:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    ds = ds.batch(global_batch_size, drop_remainder=training)
    if shard_by is not None:
        if not training:
            raise ConfigError("shard_by needs training=True (full global batches); evaluate "
                              "the whole test set on every process instead.")
        num_shards, index = shard_by
        shard_indices(0, num_shards, index)  # validates
        per = per_replica_batch_size(global_batch_size, num_shards)
        # Every global batch is full (drop_remainder), so its slices are equal. A slice
        # of each batch, not unbatch-rebatch-shard: less copying, and the batch
        # dimension stays static, as an unsharded pipeline's is.
        ds = ds.map(_rows(ds.element_spec, index * per, per))
    if repeat:
        ds = ds.repeat()
    if skip_batches:
        ds = ds.skip(skip_batches)
    ds = ds.prefetch(tf.data.AUTOTUNE)
    policy = choose_shard_policy(source.num_files, num_workers)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = getattr(
        tf.data.experimental.AutoShardPolicy, policy)
    options.deterministic = True
    return ds.with_options(options)


def count_elements(dataset) -> int:
    """Elements (examples, or batches of a batched dataset) in one pass of a
    finite dataset; iterates it when TensorFlow can't tell."""
    import tensorflow as tf

    n = int(dataset.cardinality())
    if n >= 0:
        return n
    if n == tf.data.INFINITE_CARDINALITY:
        raise ConfigError("The training dataset is infinite; set --steps-per-epoch.")
    return int(dataset.reduce(0, lambda count, _: count + 1))


def check_full_batch(batched, global_batch_size: int, examples=None) -> None:
    """Raises unless one pass of the training data gives at least one full global batch.

    Training drops a last partial batch (every step is a whole global batch),
    so data smaller than one batch gives no step at all: Keras then "runs out
    of data" at once and, with --steps-per-epoch, a repeated empty pass never
    yields. Cheap: the cardinality when TensorFlow knows it, else one batch read.

    Args:
        batched: One pass of the batched training data (`prepare(..., repeat=False)`).
        global_batch_size: The batch it was cut at.
        examples: A callable giving the examples in one pass (or None when
            unknown), called only for the message.

    Raises:
        ConfigError: when there is no full batch.
    """
    n = int(batched.cardinality())
    if n > 0 or n == -1 or (n == -2 and any(True for _ in batched.take(1))):
        return  # -1: infinite (a repeating source); -2: unknown, and a batch came
    examples = examples() if examples else None
    have = f"{examples} examples, fewer" if examples is not None else "fewer examples"
    raise ConfigError(
        f"The training data has {have} than one global batch of {global_batch_size} (training "
        "drops a partial batch, so no step would run). Use a smaller --global-batch-size"
        + (f" (at most {examples})." if examples else "."))
