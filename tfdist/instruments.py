"""Run instrumentation that is not training: options and hooks another package owns.

The benchmarks slow one worker down (`tfdist.straggler`); such knobs
are not part of the framework's option table. A package registers an
`Instrument` (its options; its hooks into the Keras `fit` loop,
`run/trainer.py`, and the parameter-server loop, `run/coordinator.py`) when it is
imported; the command that wants it imports that package (`tfdist.train`
imports the benchmarks' straggler). The run pipeline calls every registered
instrument and names none. Instrument options never change what a run
computes, so they are not part of a backup's recorded configuration.
Pure Python, no TensorFlow.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping


class Instrument:
    """Options and hooks of one instrumentation; the defaults do nothing.

    Every hook is given `opts`, the run's instrument options (`section`): one
    attribute per registered option key, e.g. `opts.straggler_delay_ms`.

    Attributes:
        options: Option declarations (`tfdist.option.Option`) by key.
    """

    options: dict = {}

    def check(self, opts, num_workers: int) -> None:
        """Pre-TensorFlow checks (ConfigError) for a job of `num_workers` training workers."""

    def fit_callbacks(self, opts, cluster) -> list:
        """Keras callbacks for this process's `fit`."""
        return []

    def step_deps(self, opts, worker_index) -> list:
        """Ops each parameter-server step runs first on its worker (`worker_index`: a tensor)."""
        return []

    def describe(self, opts) -> dict[str, Any]:
        """JSON-able facts for metrics.json."""
        return {}

    def line_fields(self, opts) -> dict[str, str]:
        """Fields for the line a run starts with."""
        return {}


REGISTERED: list[Instrument] = []


def register(instrument: Instrument) -> Instrument:
    """Adds an instrument (once; registering the same class again is a no-op)."""
    if not any(type(i) is type(instrument) for i in REGISTERED):
        REGISTERED.append(instrument)
    return instrument


def options() -> dict:
    """Every registered instrument's option declarations, by key."""
    return {k: o for i in REGISTERED for k, o in i.options.items()}


def section(values: Mapping[str, Any]):
    """Pure function: instrument option values as one frozen object, an attribute per key."""
    fields = sorted(values)
    cls = dataclasses.make_dataclass("InstrumentOptions", fields, frozen=True)
    return cls(**{k: values[k] for k in fields})


def active(opts) -> list[Instrument]:
    """The registered instruments whose options `opts` (a `section`) has."""
    return [i for i in REGISTERED if all(hasattr(opts, k) for k in i.options)]
