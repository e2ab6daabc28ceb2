"""The merged configuration as typed sections, one per concern, built once.

`tfdist.config.merge` gives a dict (`cfg["epochs"]`: recipes and user code
keep reading it that way); `Settings.of(cfg)` reads it once into frozen
dataclasses the run pipeline reads by attribute. Each framework option
belongs to exactly one section (tests/test_settings.py): the strategy
adapters' options to `tfdist.strategies.StrategyOptions` (their own section,
whose fields declare them, under the same names), a recipe's own options stay
in `recipe`, and registered instruments' (`tfdist.instruments`) in
`instruments`. Pure Python, no TensorFlow.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from tfdist import instruments, strategies


@dataclasses.dataclass(frozen=True)
class Training:
    """What the loop runs: epochs of steps over batches of the recipe's data."""

    epochs: int
    steps_per_epoch: int  # 0: one pass over the data
    global_batch_size: int
    shuffle_buffer: int
    seed: int


@dataclasses.dataclass(frozen=True)
class Optimization:
    """How the weights move."""

    optimizer: str
    learning_rate: float
    lr_scaling: str
    base_batch_size: int
    momentum: float
    warmup_steps: int
    lr_schedule: str
    warmup_epochs: float
    clipnorm: float
    accumulate: int
    precision: str


@dataclasses.dataclass(frozen=True)
class Runtime:
    """This process's TensorFlow runtime."""

    threads: int
    inter_op_threads: int
    deterministic: bool


@dataclasses.dataclass(frozen=True)
class Logs:
    """What is printed and logged (the chief writes the files)."""

    verbose: str
    tf_logs: bool
    csv_log: bool
    tensorboard: bool


@dataclasses.dataclass(frozen=True)
class Backup:
    """The model dir, its backups and resuming from them."""

    model_dir: str
    resume: bool
    rescale_lr_on_batch_change: bool
    keep: int
    save_every_steps: int
    preempt_check_steps: int
    status_file: str
    final_weights: str


_SECTIONS = {"training": Training, "optimization": Optimization, "runtime": Runtime,
             "logs": Logs, "backup": Backup}


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every option of a run, by concern.

    Attributes:
        strategy: `--strategy` as given ("auto" or a concrete name).
        training, optimization, runtime, logs, backup: The sections.
        adapter: The strategy adapters' options (`StrategyOptions`).
        recipe: The recipe's own options, by key.
        instruments: Registered instruments' options (`tfdist.instruments.section`),
            an attribute per key.
    """

    strategy: str
    training: Training
    optimization: Optimization
    runtime: Runtime
    logs: Logs
    backup: Backup
    adapter: strategies.StrategyOptions
    recipe: dict
    instruments: Any

    @classmethod
    def of(cls, cfg: Mapping[str, Any]) -> "Settings":
        """Reads a merged configuration (`config.merge`) into sections.

        Raises:
            KeyError: naming a framework option `cfg` lacks.
        """
        extra = instruments.options()
        known = {"strategy", *strategies.ADAPTER_OPTIONS, *section_keys(), *extra}
        return cls(
            strategy=cfg["strategy"],
            **{name: section(**{f.name: cfg[f.name] for f in dataclasses.fields(section)})
               for name, section in _SECTIONS.items()},
            adapter=strategies.StrategyOptions(
                **{k: cfg[k] for k in strategies.ADAPTER_OPTIONS}),
            recipe={k: v for k, v in cfg.items() if k not in known},
            instruments=instruments.section({k: v for k, v in cfg.items() if k in extra}))

    def value(self, key: str):
        """One option's value by its key (e.g. "warmup_epochs"), in whichever section
        holds it: for code that handles options by key (an adapter's `refuses`).

        Raises:
            KeyError: for a key no section holds.
        """
        if key == "strategy":
            return self.strategy
        for name, section in _SECTIONS.items():
            if key in {f.name for f in dataclasses.fields(section)}:
                return getattr(getattr(self, name), key)
        if key in strategies.ADAPTER_OPTIONS:
            return getattr(self.adapter, key)
        if hasattr(self.instruments, key):
            return getattr(self.instruments, key)
        return self.recipe[key]


def section_keys() -> list[str]:
    """The option keys the sections hold (not `strategy`, not the adapters')."""
    return [f.name for section in _SECTIONS.values() for f in dataclasses.fields(section)]
