"""``type: choice``: one of ``values`` (numbers, strings or booleans); the one expression a
grid takes (each value in turn). Registered by ``sweeps.expressions``; tested in
tests/unit/sweeps/test_space.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torchyard.sweeps.expressions.base import (
    MAX_CHOICES,
    MAX_STRING,
    VALUES,
    Draws,
    Expression,
    Range,
    Value,
    bad,
    finite,
    format_value,
)


@dataclass(frozen=True)
class Choice(Expression):
    """One of ``values``; grid sampling takes each in turn."""

    values: tuple[Value, ...]

    TYPE = "choice"
    SUMMARY = "one of values (numbers, strings or booleans)"
    FIELDS = (VALUES,)

    def __post_init__(self) -> None:
        raw: Any = self.values
        if isinstance(raw, str | bytes) or not isinstance(raw, Sequence):
            raise bad("values", f"must be a list, got {raw!r}")
        if not raw:
            raise bad("values", "is empty: a choice needs at least one value")
        if len(raw) > MAX_CHOICES:
            raise bad("values", f"has {len(raw)} values; at most {MAX_CHOICES}")
        seen: dict[str, int] = {}
        for i, value in enumerate(raw):
            field = f"values[{i}]"
            if isinstance(value, str):
                if "\x00" in value:
                    raise bad(field, "a NUL character cannot be passed in an argument")
                if len(value) > MAX_STRING:
                    raise bad(field, f"is {len(value)} characters long; at most {MAX_STRING}")
            elif isinstance(value, bool | int):
                pass
            elif isinstance(value, float):
                finite(field, value)
            else:
                raise bad(field, f"must be a number, a string or a bool, got {value!r}")
            text = format_value(value)
            if text in seen:
                raise bad(field, f"{text} is listed twice (also values[{seen[text]}])")
            seen[text] = i
        object.__setattr__(self, "values", tuple(raw))

    def draw(self, u: Draws) -> Value:
        return self.values[min(int(u(0) * len(self.values)), len(self.values) - 1)]

    def grid_values(self) -> tuple[Value, ...]:
        return self.values

    def search_range(self) -> Range:
        return Range("categorical", values=self.values)


def choice(*options: Any) -> Choice:
    """``choice(16, 32, 64)`` or ``choice([16, 32, 64])`` (Azure ML's name)."""
    values = options[0] if len(options) == 1 and isinstance(options[0], list | tuple) else options
    return Choice(tuple(values))
