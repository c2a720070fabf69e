"""Declared checks: the rule of each argument (type, range, choices), written once and applied by every way in.

A check is a small frozen object that knows one rule and raises ``ValueError`` naming the argument, the value it
got and what to do instead. Configuration dataclasses attach their check to the field itself (`hyperparameter`
puts it into the field's ``metadata["check"]`` beside its help text), and `check_fields` applies every declared
check of an instance, so the command line, a YAML file and a Python constructor meet the same rule with the
same words. Arguments that are not dataclass fields (the environment's keywords) use the same check objects.

Types are strict, as a YAML file needs them to be: a bool is never a number, a float is never an integer (an
integer is accepted where a real number is asked for), a string is never a list. Numbers must be finite.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Check",
    "Choice",
    "FieldMetadata",
    "Flag",
    "Integer",
    "ListOf",
    "Real",
    "Text",
    "check_fields",
    "check_value",
    "hyperparameter",
    "with_default",
]


def _shown(value: Any) -> str:
    """``repr`` of a value, shortened: an error message must stay one readable line whatever was passed."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


class Check:
    """One rule for one argument; calling it with ``(name, value)`` raises ``ValueError`` when it is broken."""

    optional: bool = False

    def __call__(self, name: str, value: Any) -> None:
        if value is None:
            if not self.optional:
                raise ValueError(f"{name} must be {self.describe()}, got None.")
            return
        self.check(name, value)

    def check(self, name: str, value: Any) -> None:
        """Raise ``ValueError`` when ``value`` (not None) breaks the rule."""
        raise NotImplementedError

    def describe(self) -> str:
        """The rule in words, as it reads after "must be"."""
        raise NotImplementedError

    def fail(self, name: str, value: Any, hint: str = "") -> None:
        """Raise the error of this rule for ``name``."""
        suffix = f"; {hint}" if hint else ""
        raise ValueError(f"{name} must be {self.describe()}, got {_shown(value)}{suffix}.")


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True)
class Real(Check):
    """A finite real number (an int is accepted) in ``[low, high]``; ``low_open``/``high_open`` exclude a bound.

    ``hint`` is added to the error (typical values, the fix).
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    optional: bool = False
    hint: str = ""

    def describe(self) -> str:
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high is not None:
            parts.append(f"{'<' if self.high_open else '<='} {self.high:g}")
        text = "a finite number" + (f" {' and '.join(parts)}" if parts else "")
        return text + (" (or None)" if self.optional else "")

    def check(self, name: str, value: Any) -> None:
        try:
            finite = _is_number(value) and math.isfinite(value)
        except OverflowError:  # an integer too large for a float
            finite = False
        if not finite:
            self.fail(name, value, self.hint)
        too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        too_high = self.high is not None and (value >= self.high if self.high_open else value > self.high)
        if too_low or too_high:
            self.fail(name, value, self.hint)


@dataclass(frozen=True)
class Integer(Check):
    """An integer (never a bool, never a float such as ``3.0``) in ``[minimum, maximum]``."""

    minimum: int | None = None
    maximum: int | None = None
    optional: bool = False
    hint: str = ""

    def describe(self) -> str:
        if self.minimum is not None and self.maximum is not None:
            text = f"an integer from {self.minimum} to {self.maximum}"
        elif self.minimum is not None:
            text = f"an integer >= {self.minimum}"
        elif self.maximum is not None:
            text = f"an integer <= {self.maximum}"
        else:
            text = "an integer"
        return text + (" (or None)" if self.optional else "")

    def check(self, name: str, value: Any) -> None:
        if not _is_integer(value):
            self.fail(name, value, self.hint)
        if (self.minimum is not None and value < self.minimum) or (
            self.maximum is not None and value > self.maximum
        ):
            self.fail(name, value, self.hint)


@dataclass(frozen=True)
class Flag(Check):
    """``True`` or ``False`` (not ``"yes"``, not 1)."""

    optional: bool = False

    def describe(self) -> str:
        return "true or false" + (" (or None)" if self.optional else "")

    def check(self, name: str, value: Any) -> None:
        if not isinstance(value, bool):
            self.fail(name, value)


@dataclass(frozen=True)
class Choice(Check):
    """One of ``options`` (a tuple, or a function returning one: registries that grow at run time)."""

    options: tuple[str, ...] | Callable[[], Iterable[str]] = ()
    optional: bool = False
    hint: str = ""

    def allowed(self) -> tuple[str, ...]:
        """The options now."""
        return tuple(self.options() if callable(self.options) else self.options)

    def describe(self) -> str:
        return "one of " + ", ".join(self.allowed()) + (" (or None)" if self.optional else "")

    def check(self, name: str, value: Any) -> None:
        if not isinstance(value, str) or value not in self.allowed():
            self.fail(name, value, self.hint)


@dataclass(frozen=True)
class Text(Check):
    """A string: non-empty unless ``allow_empty``, at most ``max_length`` characters, no NUL character."""

    max_length: int | None = None
    allow_empty: bool = False
    optional: bool = False
    hint: str = ""

    def describe(self) -> str:
        text = "a string" if self.allow_empty else "a non-empty string"
        if self.max_length is not None:
            text += f" of at most {self.max_length} characters"
        return text + (" (or None)" if self.optional else "")

    def check(self, name: str, value: Any) -> None:
        if not isinstance(value, str):
            self.fail(name, value, self.hint)
        if (not value.strip() and not self.allow_empty) or "\x00" in value:
            self.fail(name, value, self.hint or "NUL characters and blank strings are refused")
        if self.max_length is not None and len(value) > self.max_length:
            self.fail(name, value, self.hint)


@dataclass(frozen=True)
class ListOf(Check):
    """A list (or tuple) whose items each pass ``item``, with ``min_length <= len <= max_length``.

    A single string is refused rather than read letter by letter (in YAML, write ``reward: [toy]``).
    """

    item: Check = field(default_factory=Text)
    min_length: int = 0
    max_length: int | None = None
    optional: bool = False
    hint: str = ""

    def describe(self) -> str:
        if self.max_length is not None and self.max_length == self.min_length:
            size = f"exactly {self.min_length} "
        elif self.max_length is not None:
            size = f"{self.min_length} to {self.max_length} "
        else:
            size = f"at least {self.min_length} " if self.min_length else ""
        return f"a list of {size}items, each {self.item.describe()}" + (" (or None)" if self.optional else "")

    def check(self, name: str, value: Any) -> None:
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            self.fail(name, value, self.hint or "write a list, e.g. [a, b] in YAML")
        if len(value) < self.min_length or (self.max_length is not None and len(value) > self.max_length):
            self.fail(name, value, self.hint)
        for index, item in enumerate(value):
            self.item(f"{name}[{index}]", item)


class FieldMetadata(Mapping):
    """A field's metadata: its help text for argparse, and its `Check` under ``"check"``.

    transformers' ``HfArgumentParser`` hands a field's metadata to ``argparse.add_argument`` as keywords; the check
    is not an argparse keyword, so it is reachable by ``metadata["check"]`` but not listed when the metadata is
    iterated or copied.
    """

    def __init__(self, help: str, check: Check | None) -> None:
        self._help, self._check = help, check

    def __getitem__(self, key: str) -> Any:
        if key == "help":
            return self._help
        if key == "check" and self._check is not None:
            return self._check
        raise KeyError(key)

    def __iter__(self) -> Any:
        return iter(("help",))

    def __len__(self) -> int:
        return 1

    def copy(self) -> dict[str, Any]:
        """The argparse keywords (what a parser copies)."""
        return {"help": self._help}


def hyperparameter(default: Any, help: str, check: Check | None = None, **kwargs: Any) -> Any:
    """A dataclass field with its help text and its declared `Check` (``metadata["check"]``, see `FieldMetadata`)."""
    metadata = FieldMetadata(help, check)
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata, **kwargs)
    return field(default=default, metadata=metadata, **kwargs)


def with_default(owner: type, name: str, default: Any) -> Any:
    """``owner``'s dataclass field ``name``, its help text and check, with another default: how a subclass changes
    the default of a field it inherits without declaring the field a second time."""
    inherited = {f.name: f for f in dataclasses.fields(owner)}[name].metadata
    return hyperparameter(default, inherited["help"], inherited.get("check"))


def check_value(check: Check | None, name: str, value: Any) -> None:
    """Apply ``check`` (None: nothing to check)."""
    if check is not None:
        check(name, value)


def check_fields(instance: Any, extra: Mapping[str, Check] | None = None, only: type | None = None) -> None:
    """Apply every check declared on ``instance``'s dataclass fields (``only``: those of that dataclass), then the
    ``extra`` checks (fields declared in a class of another library, such as transformers' ``TrainingArguments``)."""
    for config_field in dataclasses.fields(only or instance):
        check_value(
            config_field.metadata.get("check"), config_field.name, getattr(instance, config_field.name)
        )
    for name, check in (extra or {}).items():
        check(name, getattr(instance, name))
