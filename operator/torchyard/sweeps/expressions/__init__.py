"""The parameter expressions (``spec.parameters.<name>.type``, Azure ML's): one module
each (or one per family: ``uniform`` holds uniform and quniform), one registry.

A new expression is one module with an :class:`~torchyard.sweeps.expressions.base.Expression`
dataclass and one :func:`register` call (docs/development/variants.md). Called by the API
(the CRD's schema of ``spec.parameters``: the type's enum, the fields, which type takes
which field, made from the registered expressions), the sweeps core (``space`` parses
through the registry, ``sampling`` draws through each expression), bayesian sampling
(``tuning.bayesian``: each expression's search range), local mode and the SDK.
"""

from __future__ import annotations

from typing import Any

from torchyard.sweeps.expressions.base import (
    FIELD_RULES,
    Expression,
    Field,
    Range,
    SpaceError,
    Value,
)
from torchyard.sweeps.expressions.choice import Choice
from torchyard.sweeps.expressions.loguniform import LogUniform, QLogUniform
from torchyard.sweeps.expressions.normal import LogNormal, Normal, QLogNormal, QNormal
from torchyard.sweeps.expressions.randint import RandInt
from torchyard.sweeps.expressions.uniform import QUniform, Uniform
from torchyard.variants import Registry, Rule, listed

REGISTRY: Registry[type[Expression]] = Registry("parameter expression")
# the registry's verbs, as this package's functions
register, unregister, get = REGISTRY.register, REGISTRY.unregister, REGISTRY.get
names, registered = REGISTRY.names, REGISTRY.registered
generation, summary = REGISTRY.generation, REGISTRY.summary


def fields() -> tuple[Field, ...]:
    """Every registered expression's fields, each once, in the order they first appear."""
    return REGISTRY.fields()


def taking(field: Field) -> tuple[str, ...]:
    """The registered expressions that take ``field``."""
    return tuple(e.TYPE for e in registered() if field in e.FIELDS)


def membership(field: Field) -> Rule[Any]:
    """The rule that ``field`` is given exactly with the expressions that take it."""
    types = taking(field)
    return Rule(
        {
            "rule": f"has(self.{field.name}) == (self.type in {list(types)})",
            "message": f"{field.name} is required by {listed(types)}, and is a field of "
            f"{listed(types)} only",
            "fieldPath": f".{field.name}",
        },
        lambda m: (getattr(m, field.attribute) is not None) == (m.type in types),
    )


def memberships() -> tuple[tuple[Field, Rule[Any]], ...]:
    """Each field with the rule of which types take it, in the order the fields appear."""
    return tuple((f, membership(f)) for f in fields())


def value_rules() -> tuple[Rule[Any], ...]:
    """The rules of the fields' values, for the fields the registered expressions take."""
    present = fields()
    return tuple(rule for needs, rule in FIELD_RULES if all(f in present for f in needs))


def cel_rules() -> tuple[Rule[Any], ...]:
    """What the CRD carries: :func:`memberships` of the fields CEL can read (not
    ``values``: the API's model checks that one), then :func:`value_rules`."""
    return (*(rule for f, rule in memberships() if f.cel), *value_rules())


for _expression in (
    Choice,
    RandInt,
    Uniform,
    QUniform,
    LogUniform,
    QLogUniform,
    Normal,
    QNormal,
    LogNormal,
    QLogNormal,
):
    register(_expression)
# The expressions this torchyard ships.
BUILT_IN: tuple[str, ...] = REGISTRY.seal()

__all__ = [
    "BUILT_IN",
    "REGISTRY",
    "Choice",
    "Expression",
    "Field",
    "LogNormal",
    "LogUniform",
    "Normal",
    "QLogNormal",
    "QLogUniform",
    "QNormal",
    "QUniform",
    "RandInt",
    "Range",
    "SpaceError",
    "Uniform",
    "Value",
    "cel_rules",
    "fields",
    "generation",
    "get",
    "memberships",
    "names",
    "register",
    "registered",
    "summary",
    "taking",
    "unregister",
    "value_rules",
]
