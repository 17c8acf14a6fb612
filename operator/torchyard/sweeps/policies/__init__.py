"""The early-termination policies (``spec.earlyTermination.type``): one module each, one
registry.

``bandit``, ``median``, ``truncation`` and ``asha`` are registered here; a new policy is
one module with a :class:`~torchyard.sweeps.policies.base.Policy` dataclass (an
``IntervalPolicy`` or a ``PausingPolicy``) and one :func:`register` call (a test module
may register its own, docs/development/variants.md). Called by the API (the CRD's schema
of ``spec.earlyTermination``, its rules and their twins, made from the registered
policies), the sweeps core (``stopping``: parse, evaluate), ``tuning`` (judge, pause,
promote), local mode and the SDK.
"""

from __future__ import annotations

from typing import Any

from torchyard.sweeps.policies.asha import Asha
from torchyard.sweeps.policies.bandit import Bandit
from torchyard.sweeps.policies.base import (
    Action,
    Decision,
    Field,
    Goal,
    IntervalPolicy,
    PausingPolicy,
    Policy,
    PolicyError,
    Rung,
    Rungs,
)
from torchyard.sweeps.policies.median import Median
from torchyard.sweeps.policies.truncation import Truncation
from torchyard.variants import Registry, Rule


def _kind(policy: type[Policy]) -> str | None:
    """What the registry refuses of a policy besides what every variant must have."""
    if not issubclass(policy, IntervalPolicy | PausingPolicy):
        return "is neither an IntervalPolicy nor a PausingPolicy"
    undeclared = policy.undeclared_fields()
    return f"{', '.join(undeclared)} are no dataclass fields" if undeclared else None


REGISTRY: Registry[type[Policy]] = Registry("early-termination policy", _kind)
# the registry's verbs, as this package's functions
register, unregister, get = REGISTRY.register, REGISTRY.unregister, REGISTRY.get
names, registered = REGISTRY.names, REGISTRY.registered
generation, summary = REGISTRY.generation, REGISTRY.summary


def fields() -> tuple[Field, ...]:
    """Every registered policy's fields, each once, in the order they first appear."""
    return REGISTRY.fields()


def rules() -> tuple[Rule[Any], ...]:
    """``spec.earlyTermination``'s rules: its type is a registered one, then every
    policy's own."""
    kinds = names()
    listed = ", ".join(kinds[:-1]) + " or " + kinds[-1] if len(kinds) > 1 else kinds[0]
    known: Rule[Any] = Rule(
        {
            "rule": f"self.type in {list(kinds)}",
            "message": f"earlyTermination.type must be {listed}",
            "fieldPath": ".type",
        },
        lambda m: m.type in kinds,
    )
    return (known, *(rule for policy in registered() for rule in policy.RULES))


def spec_rules() -> tuple[Rule[Any], ...]:
    """The rules of the Sweep's spec that its policy brings (asha: checkpoints)."""
    return tuple(rule for policy in registered() for rule in policy.SPEC_RULES)


for _policy in (Bandit, Median, Truncation, Asha):
    register(_policy)
# The policies this torchyard ships.
BUILT_IN: tuple[str, ...] = REGISTRY.seal()

__all__ = [
    "BUILT_IN",
    "REGISTRY",
    "Action",
    "Asha",
    "Bandit",
    "Decision",
    "Field",
    "Goal",
    "IntervalPolicy",
    "Median",
    "PausingPolicy",
    "Policy",
    "PolicyError",
    "Rung",
    "Rungs",
    "Truncation",
    "fields",
    "generation",
    "get",
    "names",
    "register",
    "registered",
    "rules",
    "spec_rules",
    "summary",
    "unregister",
]
