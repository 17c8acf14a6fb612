"""The distribution types (``spec.distribution.type``): one module each, one registry.

``pytorch`` (both launches), ``mpi`` and ``none`` are registered here; a new type is one
module with a :class:`DistributionType` subclass and one :func:`register` call (a test
module may register its own). Called by the API (which types exist, their rules), by
``planning`` (a node's variables, its Pod's extra parts), the controller (a per-run key),
local mode (how many launchers) and the SDK; see docs/architecture.md, "Distribution types".
Standard library only; below the API in the layers, so that the API validates a run's type
against this registry (it imports only ``launch.contract``, the launcher's names).
"""

from __future__ import annotations

from torchyard.distributions.base import DistributionType, Place, PodParts, Rule, Spec
from torchyard.distributions.mpi import Mpi
from torchyard.distributions.none import NoDistribution
from torchyard.distributions.pytorch import PyTorch

_REGISTRY: dict[str, DistributionType] = {}


def register(kind: DistributionType) -> DistributionType:
    """Make ``kind`` a valid ``spec.distribution.type`` (its name must be new)."""
    if not kind.name or kind.name in _REGISTRY:
        raise ValueError(f"distribution type {kind.name!r} is empty or already registered")
    _REGISTRY[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    """Forget a registered type (a test's own); the built-in ones stay."""
    if name in BUILT_IN:
        raise ValueError(f"distribution type {name!r} is built in")
    _REGISTRY.pop(name, None)


def get(name: str) -> DistributionType:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"distribution.type {name!r} is not one of {', '.join(_REGISTRY)}"
        ) from None


def of(spec: Spec) -> DistributionType:
    """The type of a run's ``spec.distribution``."""
    return get(spec.type)


def names() -> tuple[str, ...]:
    """The registered types, in the order they were registered."""
    return tuple(_REGISTRY)


def rules() -> tuple[Rule[Spec], ...]:
    """Every registered type's rules, which apply to every run."""
    return tuple(rule for kind in _REGISTRY.values() for rule in kind.rules)


for _kind in (PyTorch(), NoDistribution(), Mpi()):
    register(_kind)
# The types this torchyard ships: the CRD's enum and rules are made from them.
BUILT_IN: tuple[str, ...] = names()
BUILT_IN_RULES: tuple[Rule[Spec], ...] = rules()

__all__ = [
    "BUILT_IN",
    "BUILT_IN_RULES",
    "DistributionType",
    "Place",
    "PodParts",
    "Rule",
    "Spec",
    "get",
    "names",
    "of",
    "register",
    "rules",
    "unregister",
]
