"""What every registry of variants shares (an early-termination policy, a parameter
expression, an input scheme): the :class:`Registry` that holds them, and a variant's
:class:`Rule`: its CEL for the CRD, which the apiserver checks, and the same rule in
Python, which the API's models check, so that local mode and the SDK, which parse specs
without an apiserver, refuse what the apiserver refuses.

Standard library only, at the bottom of the layers: the registries (``sweeps.policies``,
``sweeps.expressions``, ``inputs.schemes``; ``distributions`` uses the rule) hold their
variants and their rules, and ``api`` puts the CEL into the CRDs and checks the twins.
Tested with each registry (tests/unit/variants/test_registries.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

Subject = TypeVar("Subject")


@dataclass(frozen=True)
class Rule(Generic[Subject]):
    """``cel``: the ``x-kubernetes-validations`` entry (rule, message, fieldPath);
    ``holds``: the same rule in Python, of the object the CEL's ``self`` is."""

    cel: dict[str, str]
    holds: Callable[[Subject], bool]

    @property
    def message(self) -> str:
        return self.cel["message"]


def broken(rules: Iterable[Rule[Any]], subject: Any) -> Rule[Any] | None:
    """The first of ``rules`` that ``subject`` breaks, None when it keeps them all."""
    for rule in rules:
        if not rule.holds(subject):
            return rule
    return None


def listed(names: Iterable[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``: names as a message lists them."""
    items = list(names)
    return ", ".join(items[:-1]) + (" and " if len(items) > 1 else "") + items[-1]


class Variant(Protocol):
    """What a registry reads of a variant (a class): its name, its line for the CRD, its
    fields (each with a ``name``), and the callbacks of its kind it leaves out."""

    @property
    def TYPE(self) -> str: ...

    @property
    def SUMMARY(self) -> str: ...

    @property
    def FIELDS(self) -> Sequence[Any]: ...

    def missing_callbacks(self) -> list[str]: ...


V = TypeVar("V", bound=Variant)


class Registry(Generic[V]):
    """The registered variants of one kind (``what``: "early-termination policy"), by
    name, in the order they were registered. :meth:`register` refuses a variant whose name
    is empty or taken, that has no summary, that leaves out a callback of its kind, that
    ``check`` refuses, or that defines a field another variant defines otherwise;
    :meth:`seal` marks the variants registered so far as built in (never unregistered)."""

    def __init__(self, what: str, check: Callable[[V], str | None] = lambda _: None) -> None:
        self.what = what
        self._check = check
        self._variants: dict[str, V] = {}
        self._built_in: tuple[str, ...] = ()
        self._generation = 0

    def register(self, variant: V) -> V:
        name = variant.TYPE
        if not name or name in self._variants:
            raise ValueError(f"{self.what} {name!r} is empty or already registered")
        if not variant.SUMMARY:
            raise ValueError(f"{self.what} {name!r} has no SUMMARY (its line in the CRD)")
        missing = variant.missing_callbacks()
        if missing:
            raise ValueError(f"{self.what} {name!r} does not implement {', '.join(missing)}")
        refused = self._check(variant)
        if refused:
            raise ValueError(f"{self.what} {name!r}: {refused}")
        known = {f.name: f for v in self._variants.values() for f in v.FIELDS}
        for field in variant.FIELDS:
            if field.name in known and known[field.name] != field:
                raise ValueError(
                    f"{self.what} {name!r} defines {field.name} otherwise than a registered one"
                )
        self._variants[name] = variant
        self._generation += 1
        return variant

    def seal(self) -> tuple[str, ...]:
        """Mark the variants registered so far built in; their names."""
        self._built_in = self.names()
        return self._built_in

    def unregister(self, name: str) -> None:
        """Forget a registered variant (a test's own); the built-in ones stay."""
        if name in self._built_in:
            raise ValueError(f"{self.what} {name!r} is built in")
        if self._variants.pop(name, None) is not None:
            self._generation += 1

    def get(self, name: Any) -> V:
        """The variant named ``name``; KeyError when none is."""
        return self._variants[name]

    def names(self) -> tuple[str, ...]:
        return tuple(self._variants)

    def registered(self) -> tuple[V, ...]:
        return tuple(self._variants.values())

    def generation(self) -> int:
        """A number that changes whenever the registry does (what caches of it key on)."""
        return self._generation

    def fields(self) -> tuple[Any, ...]:
        """Every variant's fields, each once, in the order they first appear."""
        out: dict[str, Any] = {}
        for variant in self._variants.values():
            for field in variant.FIELDS:
                out.setdefault(field.name, field)
        return tuple(out.values())

    def summary(self) -> str:
        """Each variant's line, as the CRD's description of its ``type`` says them."""
        return "; ".join(f"{v.TYPE}: {v.SUMMARY}" for v in self._variants.values()) + "."
