"""What an early-termination policy is (``spec.earlyTermination.type``), and what every
policy shares: the goal, the decisions, the errors, the metric as policies compare it.

A policy is one module with one frozen dataclass, registered with
:func:`torchyard.sweeps.policies.register`. The class is the descriptor: its ``TYPE``,
its ``SUMMARY`` (the CRD's and the reference's line), its ``FIELDS`` (the JSON form and the
CRD's schema of each), its ``RULES`` (CEL for the CRD and their Python twins, of
``spec.earlyTermination``; ``SPEC_RULES`` of the Sweep's spec), and its behaviour; an
instance is a Sweep's parsed policy. A policy is one of two kinds, each with callbacks
registration refuses a policy without:

- :class:`IntervalPolicy` (Azure ML's: bandit, median, truncation): at every
  ``evaluationInterval``-th interval from ``delayEvaluation``, :meth:`~IntervalPolicy.decide`
  whether a trial continues or stops, comparing it with every trial that reached the
  interval (``sweeps.stopping.evaluate``);
- :class:`PausingPolicy` (asha): it records trials at rungs, pauses those below a cutoff
  with their checkpoint and promotes them later (``tuning.sweep_policy``); local mode,
  which does not suspend trials, refuses it.

Pure: no clock, no randomness but sha256. Standard library only.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, fields
from enum import Enum
from typing import Any, ClassVar

from torchyard.variants import Rule, listed


class PolicyError(ValueError):
    """A policy or goal that cannot be used; ``field`` is the spec field at fault."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


class Goal(str, Enum):
    MAXIMIZE = "maximize"
    MINIMIZE = "minimize"


class Action(str, Enum):
    CONTINUE = "continue"
    STOP = "stop"
    PAUSE = "pause"
    PROMOTE = "promote"


@dataclass(frozen=True)
class Decision:
    """What to do with one trial, why, and at which interval (or ASHA resource)."""

    trial: int
    action: Action
    reason: str
    at: float | None = None


@dataclass(frozen=True)
class Field:
    """One field of a policy: its JSON name, the dataclass's attribute (also the API
    model's), a JSON number or integer, what the CRD says of it, its default there (None:
    none) and the bounds the CRD's schema holds it to."""

    name: str
    attribute: str
    integer: bool
    description: str
    default: int | float | None = None
    minimum: int | float | None = None
    maximum: int | float | None = None
    required: bool = False


def required(policy: str, field: Field) -> Rule[Any]:
    """The rule that ``field`` is given with ``policy`` and with no other policy."""
    return Rule(
        {
            "rule": f"(self.type == '{policy}') == has(self.{field.name})",
            "message": f"{field.name} is required by {policy}, and is a field of {policy} only",
            "fieldPath": f".{field.name}",
        },
        lambda m: (m.type == policy) == (getattr(m, field.attribute) is not None),
    )


def only(policy: str, *owned: Field) -> Rule[Any]:
    """The rule that the optional ``owned`` fields are given with ``policy`` only."""
    return Rule(
        {
            "rule": f"self.type == '{policy}' || !("
            + " || ".join(f"has(self.{f.name})" for f in owned)
            + ")",
            "message": f"{listed(f.name for f in owned)} are fields of {policy} only",
            "fieldPath": f".{owned[0].name}",
        },
        lambda m: m.type == policy or all(getattr(m, f.attribute) is None for f in owned),
    )


def check_integer(field: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PolicyError(field, f"must be an integer, got {value!r}")
    if value < least:
        raise PolicyError(field, f"must be at least {least}, got {value}")
    return value


def check_number(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PolicyError(field, f"must be a finite number, got {value!r}")
    return float(value)


class Policy:
    """The descriptor of an early-termination policy (see the module docstring); its
    subclasses are frozen dataclasses whose fields are ``FIELDS``' attributes."""

    TYPE: ClassVar[str] = ""
    SUMMARY: ClassVar[str] = ""
    FIELDS: ClassVar[tuple[Field, ...]] = ()
    RULES: ClassVar[tuple[Rule[Any], ...]] = ()
    SPEC_RULES: ClassVar[tuple[Rule[Any], ...]] = ()

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], field: str) -> Policy:
        """The policy of a JSON form whose ``type`` is this one's; :class:`PolicyError`
        names the field at fault, under ``field``."""
        names = {f.name: f.attribute for f in cls.FIELDS}
        unknown = sorted(str(k) for k in obj if k != "type" and k not in names)
        if unknown:
            raise PolicyError(
                f"{field}.{unknown[0]}",
                f"is not a field of {cls.TYPE} (its fields: {', '.join(names)})",
            )
        missing = [f.name for f in cls.FIELDS if f.required and f.name not in obj]
        if missing:
            raise PolicyError(f"{field}.{missing[0]}", f"is required by {cls.TYPE}")
        try:
            return cls(**{names[k]: v for k, v in obj.items() if k != "type"})
        except PolicyError as e:
            raise PolicyError(f"{field}.{e.field}", str(e).split(": ", 1)[1]) from None

    def to_json(self) -> dict[str, Any]:
        """The JSON form :meth:`from_json` reads (fields left at None left out)."""
        out: dict[str, Any] = {"type": self.TYPE}
        for f in self.FIELDS:
            value = getattr(self, f.attribute)
            if value is not None:
                out[f.name] = value
        return out

    @classmethod
    def missing_callbacks(cls) -> list[str]:
        """The callbacks of its kind this policy does not implement (registration
        refuses it then)."""
        return sorted(getattr(cls, "__abstractmethods__", ()))

    @classmethod
    def undeclared_fields(cls) -> list[str]:
        """``FIELDS`` attributes that are not fields of the dataclass."""
        try:
            declared = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        except TypeError:
            declared = set()
        return [f.attribute for f in cls.FIELDS if f.attribute not in declared]


class IntervalPolicy(Policy, ABC):
    """A policy judged at evaluation intervals: every ``evaluation_interval``-th interval
    that is at least ``delay_evaluation`` (an interval is one report of the primary metric,
    as in Azure ML)."""

    evaluation_interval: int
    delay_evaluation: int

    def check_schedule(self) -> None:
        check_integer("evaluationInterval", self.evaluation_interval, 1)
        check_integer("delayEvaluation", self.delay_evaluation, 0)

    def applies_at(self, interval: int) -> bool:
        """Whether the policy applies at ``interval`` (1 for the first report)."""
        return (
            interval >= 1
            and interval % self.evaluation_interval == 0
            and interval >= self.delay_evaluation
        )

    def schedule(self) -> str:
        return f"every {self.evaluation_interval} from interval {max(self.delay_evaluation, 1)}"

    @abstractmethod
    def decide(
        self, goal: Goal, peers: Mapping[int, Sequence[float | None]], trial: int, n: int
    ) -> Decision:
        """The decision for ``trial`` at its evaluation interval ``n``; ``peers`` holds the
        metric over the first ``n`` intervals of every trial that reached ``n`` (``trial``
        among them)."""


@dataclass(frozen=True)
class Rung:
    """One rung of a bracket: its milestone (resource) and the trials recorded there, in
    the order they reached it, each with its score (the metric, negated when minimizing,
    as Ray's ``metric_op``)."""

    milestone: float
    recorded: tuple[tuple[int, float], ...] = ()

    def has(self, trial: int) -> bool:
        return any(t == trial for t, _ in self.recorded)


@dataclass(frozen=True)
class Rungs:
    """A pausing policy's state: every bracket's rungs, highest milestone first (as Ray
    keeps them), kept by the caller (the Sweep's ledger, one value per trial per rung)."""

    brackets: tuple[tuple[Rung, ...], ...]


class PausingPolicy(Policy, ABC):
    """A policy that records trials at rungs, pauses a trial below a rung's cutoff with
    its checkpoint and promotes it later (the Sweep suspends and resumes the trial)."""

    @abstractmethod
    def start(self) -> Rungs:
        """No trial recorded anywhere yet."""

    @abstractmethod
    def bracket(self, seed: int, trial: int) -> int:
        """The bracket ``trial`` runs in (the same after a restart)."""

    @abstractmethod
    def runs_to_end(self, resource: float) -> bool:
        """Whether a trial at ``resource`` runs to its end by itself (not judged again)."""

    @abstractmethod
    def report(
        self,
        goal: Goal,
        state: Rungs,
        trial: int,
        resource: float,
        value: float | None,
        bracket: int = 0,
    ) -> tuple[Rungs, Decision]:
        """A trial of ``bracket`` reported ``value`` at ``resource``: the rungs with it
        recorded, and CONTINUE, PAUSE or STOP."""

    @abstractmethod
    def promotions(self, goal: Goal, state: Rungs, paused: Collection[int]) -> list[Decision]:
        """The paused trials to promote now, best first."""


# -- the metric, as the policies compare it --------------------------------------------


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def score(goal: Goal, value: float | None) -> float:
    """Higher is better: the metric, negated when minimizing; -inf for no finite number."""
    if value is None or not math.isfinite(value):
        return -math.inf
    return value if goal is Goal.MAXIMIZE else -value


def scores(goal: Goal, values: Sequence[float | None]) -> list[float]:
    """:func:`score` of each value (one comprehension: policies call it per trial per
    report)."""
    sign = 1.0 if goal is Goal.MAXIMIZE else -1.0
    inf = math.inf
    return [sign * v if v is not None and -inf < v < inf else -inf for v in values]


def unscore(goal: Goal, value: float) -> float:
    return value if goal is Goal.MAXIMIZE else -value


def show(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "no finite number"
    return f"{value:.6g}"


# The two fields of every interval policy, and what the CRD says of them.
EVALUATION_INTERVAL = Field(
    "evaluationInterval",
    "evaluation_interval",
    integer=True,
    description="Apply the policy every this many intervals.",
    default=1,
    minimum=1,
    maximum=100000,
)
DELAY_EVALUATION = Field(
    "delayEvaluation",
    "delay_evaluation",
    integer=True,
    description="Apply it from this interval on (the first intervals are never judged).",
    default=0,
    minimum=0,
    maximum=100000,
)
SCHEDULE = (EVALUATION_INTERVAL, DELAY_EVALUATION)
