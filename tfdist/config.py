"""Run configuration: framework defaults, recipe defaults, typed CLI overrides.

Pure Python (no TensorFlow), so that every bad flag fails in milliseconds.
Like nanoGPT's configurator: a recipe's DEFAULTS extend and override the
framework's; `--key value` overrides are parsed with the type of the default;
an unknown key is an error that lists the known ones.
"""

from __future__ import annotations

from typing import Any

from tfdist.errors import ConfigError

# Options every recipe has. A recipe's DEFAULTS may change these values.
FRAMEWORK_DEFAULTS: dict[str, Any] = {
    # auto | single | mirrored | multi_worker | shm | horovod | parameter_server | model_parallel | pipeline
    "strategy": "auto",
    "epochs": 5,
    "global_batch_size": 64,     # examples per optimizer step, all replicas together
    "learning_rate": 0.05,
    "lr_scaling": "none",        # none | linear | sqrt, relative to base_batch_size
    "base_batch_size": 0,        # batch the learning rate was tuned for (0: global_batch_size)
    "optimizer": "sgd",          # any keras.optimizers name: sgd, adam, adamw, lamb, ...
    "momentum": 0.0,             # for optimizers that take it (sgd, rmsprop)
    "warmup_steps": 0,           # linear LR warmup over this many optimizer steps
    "lr_schedule": "constant",   # constant | inverse_sqrt (= noam): decay after warmup
    "clipnorm": 0.0,             # clip by global norm, after the cross-replica reduction
    "accumulate": 1,             # gradient accumulation: update every K micro-batches
    "precision": "float32",      # float32 | mixed_float16 (loss-scaled) | mixed_bfloat16
    "seed": 0,
    "devices": 0,                # local replicas (logical CPUs without GPUs); 0: all/auto
    "model_dir": "",             # default: runs/RECIPE/STRATEGY[-Nw][-Ndev] (tfdist.run_dir)
    "deterministic": False,      # enable_op_determinism: bitwise repeatable runs
    "collective": "auto",        # multi_worker collective: auto | ring | nccl
    "collective_timeout_s": 300.0,  # a dead peer ends the job after this long
    "startup_timeout_s": 300.0,  # multi_worker: a peer that never starts ends the job after this long
    "threads": 0,                # intra-op threads per process; 0: TensorFlow's choice
    # inter-op threads per process; 0: TensorFlow's choice. With --threads 1 a worker
    # still used ~1.5 cores through the inter-op pool (bench scaling); 1 makes it one.
    "inter_op_threads": 0,
    "shuffle_buffer": 0,         # 0: no shuffling (keeps runs comparable)
    "steps_per_epoch": 0,        # 0: one pass over the data
    # Keras progress (chief only): 0 none, 1 bars, 2 one line per epoch; auto: bars on
    # a terminal, epoch lines in a pipe or file (launcher, Slurm), where bars are escape codes.
    "verbose": "auto",
    "tf_logs": False,            # show TensorFlow's C++ start-up lines (or TFDIST_TF_LOGS=1)
    "resume": True,              # resume from MODEL_DIR/backup if it holds a backup
    "keep": 3,                   # backups kept in MODEL_DIR/backup
    "save_every_steps": 0,       # also back up mid-epoch every N steps (0: epoch ends only)
    "preempt_check_steps": 0,    # steps between workers' agreement on a SIGTERM (0: auto)
    "csv_log": True,             # chief writes MODEL_DIR/history.csv each epoch
    "tensorboard": False,        # chief writes TensorBoard logs to MODEL_DIR/logs
    # The chief writes its exit status here (atomically) before exiting: launchers
    # that report 1 for any failed rank (horovodrun) lose the 75 of a preemption.
    "status_file": "",
    "microbatches": 1,           # pipeline: micro-batches per batch (GPipe)
    "placement": "",             # model_parallel/pipeline: "a,b=/cpu:0;c=/cpu:1" (default: even split)
    "warmup_epochs": 0.0,        # horovod, shm: ramp lr from lr/size up to lr over these epochs
    "straggler_delay_ms": 0,     # sleep this long in every step of one worker (sync vs async)
    "straggler_worker": 0,       # which training worker sleeps (its index among the workers)
    "ps_shards": 0,              # parameter_server: variable partitioning (>1 refused: Keras 3)
    "min_shard_bytes": 262144,   # parameter_server: smallest variable shard
}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _convert(key: str, raw: str, default: Any) -> Any:
    kind = type(default)
    try:
        if kind is bool:
            low = raw.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
    except ValueError:
        raise ConfigError(f"--{key.replace('_', '-')} expects a {kind.__name__} "
                          f"(default {default!r}). Received: {raw!r}.") from None
    return raw


def parse_overrides(argv: list[str], defaults: dict[str, Any],
                    context: str = "this recipe") -> dict[str, Any]:
    """Parses `--key value`, `--key=value`, `--flag` and `--no-flag` tokens.

    Args:
        argv: Tokens after the recipe name.
        defaults: Known keys and their defaults (their types type the values).
        context: Named in errors, e.g. "recipe digits_mlp".

    Returns:
        Only the overridden keys, with typed values.

    Raises:
        ConfigError: for an unknown key, a missing value or a bad type.
    """
    out: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("--") or token == "--":
            raise ConfigError(f"Expected an option like --key value. Received: {token!r}.")
        name, has_eq, raw = token[2:].partition("=")
        key = name.replace("-", "_")
        negated = False
        if key not in defaults and key.startswith("no_") and isinstance(
                defaults.get(key[3:]), bool) and not has_eq:
            key, negated = key[3:], True
        if key not in defaults:
            known = ", ".join(f"--{k.replace('_', '-')}" for k in sorted(defaults))
            raise ConfigError(f"Unknown option --{name} for {context}. Known options: {known}.")
        default = defaults[key]
        if negated:
            out[key] = False
            i += 1
            continue
        if not has_eq:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if isinstance(default, bool) and (nxt is None or nxt.lower() not in _TRUE | _FALSE):
                out[key] = True
                i += 1
                continue
            if nxt is None or (nxt.startswith("--") and not _looks_negative(nxt)):
                raise ConfigError(f"--{name} needs a value (default {default!r}).")
            raw = nxt
            i += 1
        out[key] = _convert(key, raw, default)
        i += 1
    return out


def _looks_negative(token: str) -> bool:
    try:
        float(token)
        return True
    except ValueError:
        return False


def merge(recipe_defaults: dict[str, Any], argv: list[str], context: str) -> dict[str, Any]:
    """Framework defaults, then the recipe's, then CLI overrides.

    Raises:
        ConfigError: when a recipe default changes a framework option's type,
            or on a bad override.
    """
    for key, value in recipe_defaults.items():
        base = FRAMEWORK_DEFAULTS.get(key)
        if base is not None and type(base) is not type(value) and not (
                isinstance(base, float) and isinstance(value, int)):
            raise ConfigError(f"{context} sets {key}={value!r} ({type(value).__name__}) but "
                              f"tfdist expects a {type(base).__name__}.")
    defaults = {**FRAMEWORK_DEFAULTS, **{
        k: float(v) if isinstance(FRAMEWORK_DEFAULTS.get(k), float) else v
        for k, v in recipe_defaults.items()}}
    return {**defaults, **parse_overrides(argv, defaults, context)}


def usage(defaults: dict[str, Any]) -> str:
    """Help text listing every option with its default."""
    lines = ["options (type from the default; --flag/--no-flag for booleans):"]
    for key in sorted(defaults):
        lines.append(f"  --{key.replace('_', '-'):24s} {defaults[key]!r}")
    return "\n".join(lines)


VERBOSE_CHOICES = ("auto", "0", "1", "2")


def keras_verbosity(setting, interactive: bool) -> int:
    """Pure function: Keras `fit`'s verbose for the --verbose setting.

    Args:
        setting: "auto", or 0, 1, 2 (as int or str).
        interactive: Whether stdout is a terminal (see `tfdist.cluster.detect_console`).

    Raises:
        ConfigError: for any other setting.
    """
    value = str(setting).strip().lower()
    if value not in VERBOSE_CHOICES:
        raise ConfigError(f"--verbose must be one of {list(VERBOSE_CHOICES)} (auto: progress "
                          f"bars on a terminal, one line per epoch otherwise). Received: "
                          f"{setting!r}.")
    if value == "auto":
        return 1 if interactive else 2
    return int(value)
