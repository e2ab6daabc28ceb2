"""One option's declaration: its type, default, allowed values and meaning.

The same declaration parses a command-line string, validates a value (from
the command line or a recipe's DEFAULTS) and writes the option's `--help`
line, so the three cannot disagree. Pure Python: no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from tfdist.errors import ConfigError

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
BOOL_WORDS = _TRUE | _FALSE
# ASCII only: Python's int() also takes "٣" and "1_000", which no one means on a command line.
_INT = re.compile(r"[+-]?[0-9]{1,30}", re.ASCII)
_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]{1,4})?", re.ASCII)
INT_LIMIT = 2**63 - 1  # the largest value TensorFlow's int64 counters can hold


def flag(name: str) -> str:
    """`--global-batch-size` for the key `global_batch_size`."""
    return "--" + name.replace("_", "-")


@dataclasses.dataclass
class Option:
    """The declaration of one option.

    Args:
        default: The default value; its type (bool, int, float, str) is the option's.
        help: What the option means, for `--help`.
        choices: The only values allowed, when not None.
        ge, gt, le, lt: Inclusive/exclusive bounds for numbers.
        strategies: The strategies the option applies to (None: all). Setting
            it on the command line under any other strategy is an error.
        note: Appended to errors about this option (what to use instead).
        old_names: Names the option had before; `tfdist.setup()` given one names
            this option in its error.
    """

    default: Any
    help: str = ""
    choices: tuple | None = None
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    strategies: tuple[str, ...] | None = None
    note: str = ""
    refused_by: tuple[str, ...] = ()  # strategies that cannot honour it (for --help)
    name: str = ""  # set by the table that holds the declaration
    old_names: tuple[str, ...] = ()

    @property
    def kind(self) -> type:
        """bool, int, float or str."""
        return type(self.default)

    def parse(self, raw: str) -> Any:
        """A command-line string as a checked value of the option's type.

        Raises:
            ConfigError: naming the option and the string received.
        """
        kind, value = self.kind, None
        if kind is bool:
            low = raw.strip().lower()
            value = True if low in _TRUE else False if low in _FALSE else None
        # Parsed stripped: str.strip() drops characters int() and float() refuse ("0\x1f").
        elif kind is int and _INT.fullmatch(raw.strip()):
            value = int(raw.strip())
        elif kind is float and raw.strip().lower() in ("nan", "inf", "-inf", "+inf", "infinity"):
            value = float(raw.strip())  # refused by check() with a clearer message
        elif kind is float and _FLOAT.fullmatch(raw.strip()):
            value = float(raw.strip())
        elif kind is str:
            value = raw
        if value is None:
            raise ConfigError(f"{flag(self.name)} expects {_a(kind)} ({self.describe()}). "
                              f"Received: {flag(self.name)} {raw!r}.")
        return self.check(value)

    def check(self, value: Any, where: str = "", keyword: bool = False) -> Any:
        """Validates a typed value; returns it (an int default accepts floats' ints).

        Args:
            value: The value.
            where: Who set it, for the message (e.g. "recipe digits_mlp sets ...").
            keyword: Name it as a keyword argument (`strategy='mirror'`, for
                `tfdist.setup()`), not as a flag (`--strategy 'mirror'`).

        Raises:
            ConfigError: naming the option, the value and what is allowed.
        """
        kind = self.kind
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if type(value) is not kind:
            raise self._error(value, f"must be {_a(kind)}, not {type(value).__name__}", where, keyword)
        if kind in (int, float):
            if kind is float and not math.isfinite(value):
                raise self._error(value, "must be a finite number", where, keyword)
            if kind is int and abs(value) > INT_LIMIT:
                raise self._error(value, f"must be at most {INT_LIMIT} in size", where, keyword)
            for bound, ok, word in ((self.ge, lambda b: value >= b, ">="),
                                    (self.gt, lambda b: value > b, ">"),
                                    (self.le, lambda b: value <= b, "<="),
                                    (self.lt, lambda b: value < b, "<")):
                if bound is not None and not ok(bound):
                    raise self._error(value, f"must be {word} {_num(bound)}", where, keyword)
        if self.choices is not None and value not in self.choices:
            valid = ", ".join(str(c) for c in self.choices)
            raise self._error(value, f"must be one of {valid}", where, keyword)
        return value

    def _error(self, value, rule: str, where: str, keyword: bool = False) -> ConfigError:
        shown = _num(value)
        who = f"{where}: " if where else ""
        note = f" {self.note}" if self.note else ""
        if keyword:
            return ConfigError(f"{who}{self.name} {rule}. Received: {self.name}={shown}.{note}")
        return ConfigError(f"{who}{flag(self.name)} {rule}. Received: {flag(self.name)} "
                           f"{shown}.{note}")

    def describe(self) -> str:
        """'default 5; >= 1' and the like, for errors and `--help`."""
        parts = [f"default {self.default!r}"]
        if self.choices is not None:
            parts.append("one of " + ", ".join(str(c) for c in self.choices))
        for bound, word in ((self.ge, ">="), (self.gt, ">"), (self.le, "<="), (self.lt, "<")):
            if bound is not None:
                parts.append(f"{word} {_num(bound)}")
        if self.refused_by:
            parts.append("not --strategy " + "|".join(self.refused_by))
        elif self.strategies is not None:
            parts.append("--strategy " + "|".join(self.strategies) + " only")
        return "; ".join(parts)


def _a(kind: type) -> str:
    return {bool: "a boolean (true/false)", int: "an integer", float: "a number",
            str: "a string"}[kind]


def _num(value) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int too long for str() (Python's 4300-digit limit)
        return "<an integer with more than 4300 digits>"
    return text if len(text) <= 40 else text[:20] + "..." + text[-10:]
