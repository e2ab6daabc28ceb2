"""Run configuration: one declaration per option, recipe defaults, CLI overrides.

Pure Python (no TensorFlow), so that every bad flag fails in milliseconds.
Each option is declared once (`Option`: default, meaning, allowed values;
the strategies it applies to come from the adapters in `tfdist.strategies`):
the general ones below, the strategy adapters' with their fields in
`tfdist.strategies.StrategyOptions`. The declaration types the `--key value`
parsing, validates every value (from the command line, a recipe's DEFAULTS or
`tfdist.setup()`) and writes `--help`. Like nanoGPT's configurator, a recipe's
DEFAULTS extend and override the framework's; an unknown key is an error
(with a did-you-mean), and so is a key given twice.

Adding a general option is one line in OPTIONS (and its field in one section of
`tfdist.settings`); adding an adapter option is one field of `StrategyOptions`.
The merged config is a dict read as `cfg["key"]`.
"""

from __future__ import annotations

import difflib
from typing import Any, Mapping

from tfdist import instruments
from tfdist.data import SCALING_RULES
from tfdist.errors import ConfigError
from tfdist.optim import PRECISIONS
from tfdist.option import BOOL_WORDS, Option, flag
from tfdist.lr_schedules import DECAYS
from tfdist.strategies import ADAPTER_OPTIONS, accepting, refusal, refused_by, valid_names

OPTIMIZERS = ("sgd", "adam", "adamw", "adamax", "adadelta", "adafactor", "adagrad", "ftrl",
              "lamb", "lion", "muon", "nadam", "rmsprop")  # keras.optimizers classes by name


def _adapter(*keys: str) -> dict[str, Option]:
    """The adapters' declarations of `keys` (`StrategyOptions`' fields), placed in the table."""
    return {k: ADAPTER_OPTIONS[k] for k in keys}


# Options every recipe has. A recipe's DEFAULTS may change their defaults. The
# adapters' options are declared with their `StrategyOptions` fields and only
# placed here (their place in --help); one not placed is listed last.
OPTIONS: dict[str, Option] = {
    "strategy": Option("auto", "how to train (auto: horovod under horovodrun, parameter_server "
                       "with ps tasks, multi_worker on a cluster, mirrored with several local "
                       "devices, else single)", choices=tuple(valid_names())),
    "epochs": Option(5, "passes over the training data", ge=1),
    "global_batch_size": Option(64, "examples per optimizer step, all replicas together "
                                "(must divide by the replica count)", ge=1),
    "learning_rate": Option(0.05, "learning rate (before --lr-scaling)", gt=0),
    "lr_scaling": Option("none", "scale the learning rate with the batch, relative to "
                         "--base-batch-size", choices=SCALING_RULES),
    "base_batch_size": Option(0, "batch the learning rate was tuned for (0: "
                              "--global-batch-size)", ge=0),
    "optimizer": Option("sgd", "a keras.optimizers class, by lower-case name",
                        choices=OPTIMIZERS),
    "momentum": Option(0.0, "momentum, for optimizers that take it (sgd, rmsprop)",
                       ge=0, le=1),
    "warmup_steps": Option(0, "linear learning-rate warmup over this many optimizer steps",
                           ge=0),
    "lr_schedule": Option("constant", "decay after the warmup (inverse_sqrt = noam needs "
                          "--warmup-steps)", choices=DECAYS),
    "clipnorm": Option(0.0, "clip by global norm, after the cross-replica reduction (0: off)",
                       ge=0),
    "accumulate": Option(1, "gradient accumulation: one update every K global batches", ge=1),
    "precision": Option("float32", "float32, or mixed precision (float16 gets loss scaling)",
                        choices=PRECISIONS),
    "seed": Option(0, "random seed (weights, shuffling)", ge=0, le=2**32 - 1),
    **_adapter("devices"),
    "model_dir": Option("", "where the chief writes model, metrics, backups (default: "
                        "runs/RECIPE/STRATEGY[-Nw][-Mps][-Ddev][-Ttp][-slurm], stages in processes "
                        "STRATEGY-Pst[-Ccp]; named from what runs and its layout: tfdist.run.run_dir)"),
    "deterministic": Option(False, "enable_op_determinism: bitwise repeatable runs"),
    **_adapter("collective", "collective_timeout_s", "startup_timeout_s", "grad_compression",
               "bucket_mb", "shard", "shard_optimizer_state"),
    "threads": Option(0, "intra-op threads per process (0: TensorFlow's choice)",
                      ge=0, le=4096),
    # --threads sizes only the intra-op pool: a worker held to one core needs 1 here too.
    "inter_op_threads": Option(0, "inter-op threads per process (0: TensorFlow's choice; "
                               "a pipeline's stage tasks take at least 2)",
                               ge=0, le=4096),
    "shuffle_buffer": Option(0, "shuffle buffer in examples (0: no shuffling, keeps runs "
                             "comparable)", ge=0),
    "steps_per_epoch": Option(0, "optimizer steps per epoch (0: one pass over the data)",
                              ge=0),
    # Bars are escape codes in a pipe or file (launcher, Slurm), hence auto.
    "verbose": Option("auto", "Keras progress on the chief: 0 none, 1 bars, 2 one line per "
                      "epoch and a progress line every 30 s of it (TFDIST_PROGRESS_S); "
                      "auto: bars on a terminal, 2 otherwise",
                      choices=("auto", "0", "1", "2")),
    "tf_logs": Option(False, "show TensorFlow's C++ start-up lines (or TFDIST_TF_LOGS=1)"),
    "resume": Option(True, "resume from MODEL_DIR/backup if it holds a backup"),
    "rescale_lr_on_batch_change": Option(
        False, "resume a backup written at another --global-batch-size: its learning rate "
        "is rescaled by --lr-scaling and its data position kept in examples; the math then "
        "differs from an uninterrupted run (without it, a batch change is refused)"),
    "keep": Option(3, "backups kept in MODEL_DIR/backup", ge=1),
    "save_every_steps": Option(0, "also back up mid-epoch every N steps (0: epoch ends only)",
                               ge=0),
    "preempt_check_steps": Option(0, "steps between workers' agreement on a SIGTERM (0: auto)",
                                  ge=0),
    "final_weights": Option("auto", "how the chief writes the trained model: keras "
                            "(MODEL_DIR/model.keras), sharded (model.json + model.weights.json "
                            "and its shards, one weight at a time), auto (sharded when "
                            "model.keras would not fit this process's memory)",
                            choices=("auto", "keras", "sharded")),
    "csv_log": Option(True, "the chief writes MODEL_DIR/history.csv each epoch"),
    "tensorboard": Option(False, "the chief writes TensorBoard logs to MODEL_DIR/logs"),
    # Launchers that report 1 for any failed rank (horovodrun) lose the 75 of a preemption.
    "status_file": Option("", "the chief writes its exit status here (atomically) before "
                          "exiting"),
    **_adapter("microbatches", "schedule", "virtual_stages", "balance", "placement", "stages",
               "tensor_parallel"),
    # Which strategies take it is decided by their adapters (`Adapter.process_replicas`).
    "warmup_epochs": Option(0.0, "horovod, shm: ramp the learning rate from lr/size up to lr "
                            "over these epochs", ge=0),
    **_adapter("ps_shards", "min_shard_bytes"),
}
OPTIONS.update({k: o for k, o in ADAPTER_OPTIONS.items() if k not in OPTIONS})  # not placed
# Which strategies an option applies to is declared by the adapters (their
# `accepts` and `refuses`), so the option table and the adapters cannot disagree.
for _name, _option in OPTIONS.items():
    _option.name = _name
    _option.strategies = accepting(_name)
    _option.refused_by = refused_by(_name)

# The rerun rule: which options a rerun in the same model dir may change (docs/options.md,
# "Reruns"; `--help` prints RERUN_RULE). A model dir holds one run. The options
# that define what it computes (the model and the recipe's own options, the data,
# the batch, the optimizer and learning rate, precision, seed, the strategy and its
# layout) make another run: a dir of its own (the default dir is named from the
# strategy and layout) or, on the same dir, a refusal naming each difference
# (`tfdist.run.run_dir.differences`). The options below only say how the run is
# driven, saved, watched or held in memory, so a rerun may change them; they are
# not recorded in backups (`run_dir.run_config`), nor are the instruments'.
RERUN_FREE: dict[str, str] = {
    # control: how far it trains and how it is backed up (--epochs extends a run)
    **dict.fromkeys(("epochs", "steps_per_epoch", "resume", "rescale_lr_on_batch_change",
                     "keep", "save_every_steps", "preempt_check_steps", "model_dir"),
                    "control"),
    # output: the forms the run's files are written in
    **dict.fromkeys(("final_weights", "csv_log", "tensorboard", "status_file"), "output"),
    # logging: what is printed
    **dict.fromkeys(("verbose", "tf_logs"), "logging"),
    # memory and speed: where state lives, threads, collectives and timeouts (the same math)
    **dict.fromkeys(("shard", "shard_optimizer_state", "threads", "inter_op_threads",
                     "deterministic",
                     "collective", "collective_timeout_s", "startup_timeout_s", "bucket_mb"),
                    "memory"),
}
# The layout: how a synchronous run's math is spread over devices and processes. It
# defines the run (the default dir is named from it), but a run may move between
# synchronous layouts with --model-dir (the same math: `run_dir.DATA_PARALLEL`).
LAYOUT = frozenset({"strategy", "devices", "microbatches", "schedule", "stages", "placement",
                    "tensor_parallel", "virtual_stages"})
RERUN_RULE = (
    "Rerunning a command on its model dir resumes its run (a finished one has nothing to "
    "do). Options that define the run (model and recipe options, data, batch, optimizer, "
    "learning rate, precision, seed, strategy and layout) make another run: its own dir, or "
    "a refusal on the same dir. Output forms (--final-weights, --csv-log, --tensorboard, "
    "--status-file), logging (--verbose, --tf-logs), memory and speed options "
    "(--shard, --shard-optimizer-state, --threads, --inter-op-threads, --bucket-mb, "
    "collectives and timeouts) and run control (--epochs, --keep, --save-every-steps, ...) may change on a "
    "rerun; on a finished run another --final-weights form is written from its last "
    "backup, and a memory or speed option is said to have nothing to act on.")


def rerun_may_change(key: str) -> bool:
    """Pure function: whether a rerun in the same model dir may change option `key`
    (`RERUN_FREE`); every other option defines the run. Instruments' options (the
    benchmarks') never define it."""
    return key in RERUN_FREE or key in instruments.options()


# The defaults as a plain dict, for code that reads them.
FRAMEWORK_DEFAULTS: dict[str, Any] = {name: o.default for name, o in OPTIONS.items()}


class Config(dict):
    """The merged configuration: a dict (`cfg["epochs"]`) that also knows each
    option's declaration and which keys the command line set.

    Attributes:
        options: The declaration of every key.
        given: Keys set on the command line (checked against the strategy).
    """

    def __init__(self, values: Mapping[str, Any], options: Mapping[str, Option],
                 given=()):
        super().__init__(values)
        self.options = dict(options)
        self.given = frozenset(given)

    @property
    def typed(self):
        """The typed view (`tfdist.settings.Settings`), read from the dict now."""
        from tfdist.settings import Settings

        return Settings.of(self)


def declarations(recipe_defaults: Mapping[str, Any], context: str) -> dict[str, Option]:
    """Framework declarations with a recipe's DEFAULTS applied.

    A recipe DEFAULTS entry is either a plain value (a new default for a
    framework option, or a new recipe option typed by its value) or an
    `Option` declaring a recipe option with its meaning and range.

    Raises:
        ConfigError: for a value of the wrong type or out of range, naming the recipe.
    """
    if not isinstance(recipe_defaults, Mapping):
        raise ConfigError(f"{context}: DEFAULTS must be a dict of option values. "
                          f"Received: {type(recipe_defaults).__name__}.")
    # The framework's options, and those of the instruments registered (tfdist.instruments).
    framework = {**OPTIONS, **instruments.options()}
    out = dict(framework)
    for key, value in recipe_defaults.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise ConfigError(f"{context}: DEFAULTS keys must be identifiers like 'hidden_units'."
                              f" Received: {key!r}.")
        if key in framework:
            if isinstance(value, Option):
                raise ConfigError(f"{context}: DEFAULTS[{key!r}] re-declares tfdist's option "
                                  f"{flag(key)}; give it a plain value.")
            base = framework[key]
            out[key] = _replace(base, default=base.check(value, f"{context} sets DEFAULTS"))
            continue
        option = value if isinstance(value, Option) else Option(value)
        if type(option.default) not in (bool, int, float, str):
            raise ConfigError(f"{context}: DEFAULTS[{key!r}] must be a bool, int, float or "
                              f"str. Received: {type(option.default).__name__}.")
        option = _replace(option, name=key)
        option.check(option.default, f"{context} sets DEFAULTS")
        out[key] = option
    return out


def _replace(option: Option, **changes) -> Option:
    import dataclasses

    return dataclasses.replace(option, **changes)


def parse_overrides(argv: list[str], defaults: Mapping[str, Any],
                    context: str = "this recipe") -> dict[str, Any]:
    """Parses `--key value`, `--key=value`, `--flag` and `--no-flag` tokens.

    Args:
        argv: Tokens after the recipe name.
        defaults: Known keys, each an `Option` or a plain default (typed by its value).
        context: Named in errors, e.g. "recipe digits_mlp".

    Returns:
        Only the overridden keys, with typed, validated values.

    Raises:
        ConfigError: for an unknown or repeated key, a missing value, a bad
            type or a value out of range.
    """
    options = {k: _replace(v if isinstance(v, Option) else Option(v), name=k)
               for k, v in defaults.items()}
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("--") or token == "--":
            raise ConfigError(f"Expected an option like --key value. Received: {token!r}.")
        name, has_eq, raw = token[2:].partition("=")
        key = name.replace("-", "_")
        negated = False
        if key not in options and key.startswith("no_") and not has_eq and (
                key[3:] in options and options[key[3:]].kind is bool):
            key, negated = key[3:], True
        if key not in options:
            raise ConfigError(_unknown(name, options, context))
        option = options[key]
        if negated:
            value, i = False, i + 1
        elif has_eq:
            value, i = option.parse(raw), i + 1
        else:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if option.kind is bool and (nxt is None or nxt.strip().lower() not in BOOL_WORDS):
                value, i = True, i + 1
            elif nxt is None or nxt.startswith("--"):
                raise ConfigError(f"{flag(key)} needs a value ({option.describe()}).")
            else:
                value, i = option.parse(nxt), i + 2
        if key in out:
            raise ConfigError(f"{flag(key)} is given twice ({spelled[key]}, then "
                              f"{_spell(token, argv, i)}); give it once.")
        out[key] = value
        spelled[key] = _spell(token, argv, i)
    return out


def _spell(token: str, argv: list[str], next_i: int) -> str:
    """The tokens that set an option, as typed."""
    value_token = argv[next_i - 1]
    return token if value_token is token else f"{token} {value_token}"


def _unknown(name: str, options: Mapping[str, Option], context: str) -> str:
    key = name.replace("-", "_")
    candidates = list(options) + [f"no_{k}" for k, o in options.items() if o.kind is bool]
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    hint = f" Did you mean {flag(close[0])}?" if close else ""
    known = ", ".join(flag(k) for k in sorted(options))
    return (f"Unknown option --{name} for {context}.{hint} Known options: {known} "
            "(`--help` gives their meaning and defaults).")


def merge(recipe_defaults: Mapping[str, Any], argv: list[str], context: str) -> Config:
    """Framework defaults, then the recipe's, then CLI overrides, all validated.

    Raises:
        ConfigError: for a recipe default of the wrong type or range, or a bad override.
    """
    options = declarations(recipe_defaults, context)
    overrides = parse_overrides(argv, options, context)
    values = {k: o.default for k, o in options.items()}
    return Config({**values, **overrides}, options, given=overrides)


# The options an own script passes to `tfdist.setup()`: how to train (every adapter
# option) and this process's runtime (what to train, and for how long, is the script's own).
SCRIPT_OPTIONS = (*ADAPTER_OPTIONS, "threads", "inter_op_threads", "tf_logs")


def for_script(strategy: str, given: Mapping[str, Any]) -> Config:
    """The configuration of an own script's `tfdist.setup(strategy, **given)`:
    the command line's declarations, defaults and checks, keyword arguments for flags.

    Raises:
        ConfigError: for an option setup() does not take (with a did-you-mean), a
            value of the wrong type or out of range, or one the strategy does not use.
    """
    context = "tfdist.setup()"
    allowed = {k: OPTIONS[k] for k in SCRIPT_OPTIONS}
    for key in given:
        if key not in allowed:
            close = [k for k, o in allowed.items() if key in o.old_names] or \
                difflib.get_close_matches(key, list(allowed), n=1, cutoff=0.6)
            hint = f" Did you mean {close[0]}=?" if close else ""
            raise ConfigError(f"{context} has no option {key}=.{hint} Its options: "
                              f"{', '.join(SCRIPT_OPTIONS)} (their meaning: python -m "
                              "tfdist.train --help).")
    # None leaves an option at its default (a script's own `--devices` unset, say).
    values = {k: allowed[k].check(v, context, keyword=True) for k, v in given.items()
              if v is not None}
    values["strategy"] = OPTIONS["strategy"].check(strategy, context, keyword=True)
    # A default passed on (a script that forwards every option) is not a choice the
    # strategy must honour; a value that differs is checked as a flag would be.
    return Config({**FRAMEWORK_DEFAULTS, **values}, OPTIONS,
                  given=[k for k, v in values.items()
                         if k != "strategy" and v != OPTIONS[k].default])


def check_strategy(cfg: Mapping[str, Any], strategy: str, possible: set[str]) -> None:
    """Refuses command-line options that do not apply to the run's strategy.

    Args:
        cfg: The merged config (a `Config`; a plain dict is not checked).
        strategy: The strategy as asked for (named in the message).
        possible: The concrete strategies it may resolve to (one, unless "auto"
            depends on what TensorFlow will find).

    Raises:
        ConfigError: naming the option, its value and the strategy.
    """
    options = getattr(cfg, "options", {})
    for key in sorted(getattr(cfg, "given", ())):
        applies = options[key].strategies
        if applies is None or set(applies) & possible:
            continue
        runs = " or ".join(sorted(possible))
        resolved = f" (auto resolves to {runs} here)" if strategy == "auto" else ""
        why = refusal(key, sorted(possible))
        if why:  # a general option the strategy cannot honour: say why, not who can
            raise ConfigError(f"{flag(key)} does not apply to --strategy {strategy}{resolved}: "
                              f"{why}. Received: {flag(key)} {cfg[key]!r}. Drop it, or use "
                              "another strategy.")
        only = ", ".join(applies)
        raise ConfigError(f"{flag(key)} applies only to --strategy {only}; this run uses "
                          f"--strategy {strategy}{resolved}. Received: {flag(key)} "
                          f"{cfg[key]!r}. Drop it, or pick one of those strategies.")


def usage(options: Mapping[str, Any], recipe_name: str = "") -> str:
    """Help text: every option with its meaning, default and allowed values.

    Args:
        options: Declarations (from `declarations`) or plain defaults.
        recipe_name: The recipe whose own options are listed apart.
    """
    def line(key, option):
        value = {bool: "", int: " N", float: " X", str: " TEXT"}[option.kind]
        if option.choices is not None and option.kind is str:
            value = " {" + "|".join(option.choices) + "}"
        head = f"  {flag(key)}{value}"
        text = f"{head:34s} {option.help}".rstrip() if option.help else head
        return f"{text}\n{'':35s}({option.describe()})"

    options = {k: v if isinstance(v, Option) else Option(v) for k, v in options.items()}
    framework = [line(k, o) for k, o in options.items() if k in OPTIONS]
    extra = instruments.options()
    instrumented = [line(k, o) for k, o in options.items() if k in extra and k not in OPTIONS]
    own = [line(k, o) for k, o in options.items() if k not in OPTIONS and k not in extra]
    out = ["tfdist options (booleans: --flag, --no-flag, --flag=false; each option at most "
           "once):", *framework]
    if instrumented:
        out += ["", "instrumentation options (benchmarks):", *instrumented]
    if own:
        out += ["", f"recipe {recipe_name or '?'} options:", *own]
    return "\n".join(out)


VERBOSE_CHOICES = OPTIONS["verbose"].choices


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
