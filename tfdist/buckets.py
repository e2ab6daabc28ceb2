"""Gradient buckets for an all-reduce that overlaps the backward pass (#31): pure arithmetic.

The backward pass makes gradients in reverse layer order, so the last
layers' gradients exist while the first layers' are still being computed.
Reduced in buckets taken from the end of the list, each bucket can start as
soon as its own gradients exist (as PyTorch DDP's `bucket_cap_mb` and
TensorFlow's `CommunicationOptions.bytes_per_pack` do), instead of one
all-reduce waiting for the whole backward pass.
"""

from __future__ import annotations

from tfdist.errors import ConfigError

# `--bucket-mb`'s default: each engine's measured one (docs/benchmarks.md, "Overlap (#31)").
ENGINE_DEFAULT = -1.0
# multi_worker: 4 MB buckets made steps 1.11-1.13x faster across 2 hosts at 1 Gbit/s
# and 1.12x on one host (wide_mlp). shm: buckets were 0.95-0.98x on one host with
# pinned cores: its all-reduce is work on the training's own cores, with nothing
# (no wire) to hide behind, and each bucket adds a Python call and two barriers.
ENGINE_DEFAULTS_MB = {"multi_worker": 4.0, "shm": 0.0}


def overlap_buckets(nbytes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Pure function: tensor indices grouped into buckets, in the order to reduce them.

    Args:
        nbytes: Each tensor's size in bytes, in the model's (forward) order.
        bucket_bytes: A bucket is closed once it holds at least this many
            bytes; 0 (or less) puts every tensor in one bucket.

    Returns:
        Buckets, the one holding the last tensor first; within a bucket the
        indices ascend. With `bucket_bytes` <= 0: one bucket, [0..n-1] (no
        overlap: today's single all-reduce). Every index appears once.
    """
    n = len(nbytes)
    if n == 0:
        return []
    if bucket_bytes <= 0:
        return [list(range(n))]
    buckets, current, used = [], [], 0
    for i in reversed(range(n)):
        current.append(i)
        used += max(0, int(nbytes[i]))
        if used >= bucket_bytes:
            buckets.append(sorted(current))
            current, used = [], 0
    if current:
        buckets.append(sorted(current))
    return buckets


def resolve(bucket_mb: float, engine: str) -> float:
    """Pure function: the bucket size in MB `engine` uses for `--bucket-mb bucket_mb`.

    Raises:
        ConfigError: for a negative size other than -1 (the engine's default);
            the adapters' `check_config` calls this before TensorFlow starts.
    """
    if bucket_mb == ENGINE_DEFAULT:
        return ENGINE_DEFAULTS_MB[engine]
    if bucket_mb < 0:
        raise ConfigError(f"--bucket-mb takes a size in MB >= 0 (0: one all-reduce), or -1 for "
                         f"the engine's default. Received: --bucket-mb {bucket_mb:g}.")
    return float(bucket_mb)


def bucket_bytes(bucket_mb: float) -> int:
    """Pure function: `--bucket-mb` in bytes (MiB, as TensorFlow's bytes_per_pack counts)."""
    return int(float(bucket_mb) * (1 << 20))
