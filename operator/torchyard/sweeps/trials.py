"""A sweep's book of trials: what the Sweep's status says about them, folded from events.

One :class:`TrialRecord` per trial (its index, parameters, state, a summary of its metric
history, its trial-seconds), in a :class:`Book` with the objective's goal. :func:`fold`
applies one :class:`Event` (the trial was created, started, reported an interval, a policy
decided, it ended) and is idempotent: an event seen again, as a controller that restarts
sees its events again, changes nothing (a report carries its interval, a decision the
trial's promotions when it was made), and an event that does not apply to the trial's
state (a report from a trial already stopped) is ignored. From the book:
the best trial by the objective (:func:`best`, the one rule every reader of a sweep
uses), the counts per state (:func:`counts`), the
trial-seconds spent and those early termination saved (:func:`seconds_saved`), and the
bounded summary the Sweep's status holds (:func:`summary`: counts, best, seconds, the top
few trials; every trial's details belong in a ConfigMap or the registry). Called by the
Sweep controller and local mode; pure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Literal, TypeAlias

from torchyard.sweeps.space import Value
from torchyard.sweeps.stopping import Action, Decision, Goal


class TrialState(str, Enum):
    PENDING = "Pending"  # made, waiting for admission (or re-admission after a promotion)
    RUNNING = "Running"
    PAUSED = "Paused"  # suspended with its checkpoint by ASHA; may be promoted
    STOPPED = "Stopped"  # ended early by the early-termination policy
    COMPLETED = "Completed"
    FAILED = "Failed"
    CANCELED = "Canceled"  # the sweep was canceled or ended while it waited


ENDED = frozenset(
    {TrialState.STOPPED, TrialState.COMPLETED, TrialState.FAILED, TrialState.CANCELED}
)

# Ended without completing: a best trial in one of these is named with its state.
ENDED_INCOMPLETE = ENDED - {TrialState.COMPLETED}

Parameters: TypeAlias = tuple[tuple[str, Value], ...]


@dataclass(frozen=True)
class TrialRecord:
    """One trial. ``intervals``: the last interval it reported (1 for the first report);
    ``last``/``best``/``mean``: its metric at that interval, its best (by the goal), the
    mean of its finite reports; ``seconds``: trial-seconds used (GPU-seconds: seconds
    times GPUs), cumulative."""

    index: int
    parameters: Parameters
    state: TrialState = TrialState.PENDING
    reason: str = ""
    intervals: int = 0
    finite: int = 0  # reports that were finite numbers
    last: float | None = None
    best: float | None = None
    best_interval: int | None = None
    mean: float | None = None
    seconds: float = 0.0
    promotions: int = 0

    def params(self) -> dict[str, Value]:
        return dict(self.parameters)


@dataclass(frozen=True)
class Created:
    trial: int
    parameters: Mapping[str, Value]


@dataclass(frozen=True)
class Started:
    trial: int


@dataclass(frozen=True)
class Reported:
    """The primary metric at ``interval`` (None or a non-finite number: reported, but not a
    number), with the trial-seconds used so far."""

    trial: int
    interval: int
    value: float | None
    seconds: float


@dataclass(frozen=True)
class Decided:
    """A policy's decision, acted on. ``epoch``: the trial's promotions when it was
    decided (:func:`decided` stamps it), so that a pause or a promotion seen again after the
    trial was promoted since is ignored; None applies it whatever came since."""

    decision: Decision
    epoch: int | None = None


@dataclass(frozen=True)
class Ended:
    trial: int
    outcome: Literal["completed", "failed", "canceled"]
    seconds: float
    reason: str = ""


Event: TypeAlias = Created | Started | Reported | Decided | Ended


@dataclass(frozen=True)
class Book:
    """Every trial of one sweep, by index. ``planned_intervals``: how many intervals a
    trial runs when nothing stops it (ASHA's ``maxResource``, the trial's epochs), for the
    trial-seconds saved; None: the longest completed trial's."""

    goal: Goal
    planned_intervals: int | None = None
    trials: tuple[TrialRecord, ...] = ()

    def get(self, index: int) -> TrialRecord | None:
        for record in self.trials:
            if record.index == index:
                return record
        return None


def _better(goal: Goal, a: float, b: float) -> bool:
    return a > b if goal is Goal.MAXIMIZE else a < b


def _put(book: Book, record: TrialRecord) -> Book:
    others = [r for r in book.trials if r.index != record.index]
    return replace(book, trials=tuple(sorted([*others, record], key=lambda r: r.index)))


def _report(goal: Goal, record: TrialRecord, event: Reported) -> TrialRecord:
    seconds = max(record.seconds, event.seconds)
    if event.interval <= record.intervals:  # seen already
        return replace(record, seconds=seconds)
    value = event.value
    changes: dict[str, Any] = {"intervals": event.interval, "last": value, "seconds": seconds}
    if value is not None and math.isfinite(value):
        finite = record.finite + 1
        mean = value if record.mean is None else record.mean + (value - record.mean) / finite
        changes.update(finite=finite, mean=mean)
        if record.best is None or _better(goal, value, record.best):
            changes.update(best=value, best_interval=event.interval)
    return replace(record, **changes)


# What each action does to a trial in each state (absent: nothing).
_DECIDED: dict[tuple[Action, TrialState], TrialState] = {
    (Action.STOP, TrialState.PENDING): TrialState.STOPPED,
    (Action.STOP, TrialState.RUNNING): TrialState.STOPPED,
    (Action.STOP, TrialState.PAUSED): TrialState.STOPPED,
    (Action.PAUSE, TrialState.RUNNING): TrialState.PAUSED,
    (Action.PROMOTE, TrialState.PAUSED): TrialState.PENDING,
}

_OUTCOMES = {
    "completed": TrialState.COMPLETED,
    "failed": TrialState.FAILED,
    "canceled": TrialState.CANCELED,
}


def fold(book: Book, event: Event) -> Book:
    """``book`` with ``event`` applied (see the module's docstring); ValueError for an
    event about a trial that was never created."""
    index = _trial_of(event)
    record = book.get(index)
    changed = _step(book.goal, record, event)
    return book if changed is record else _put(book, changed)


def _trial_of(event: Event) -> int:
    return event.decision.trial if isinstance(event, Decided) else event.trial


def _step(goal: Goal, record: TrialRecord | None, event: Event) -> TrialRecord:
    """Trial ``record`` (None: not created yet) with ``event`` about it applied: the
    record itself when the event changes nothing."""
    if isinstance(event, Created):
        if record is not None:
            return record
        parameters = tuple((n, event.parameters[n]) for n in sorted(event.parameters))
        return TrialRecord(event.trial, parameters)
    if record is None:
        raise ValueError(f"trial {_trial_of(event)} was not created")
    if record.state in ENDED:
        return record
    if isinstance(event, Started):
        if record.state is not TrialState.PENDING:
            return record
        return replace(record, state=TrialState.RUNNING, reason="")
    if isinstance(event, Reported):
        if record.state is not TrialState.RUNNING:
            return replace(record, seconds=max(record.seconds, event.seconds))
        return _report(goal, record, event)
    if isinstance(event, Decided):
        if event.epoch is not None and event.epoch != record.promotions:
            return record  # decided before a promotion since: stale
        action = event.decision.action
        state = _DECIDED.get((action, record.state))
        if state is None:
            return record
        promotions = record.promotions + (action is Action.PROMOTE)
        return replace(record, state=state, reason=event.decision.reason, promotions=promotions)
    seconds = max(record.seconds, event.seconds)
    return replace(record, state=_OUTCOMES[event.outcome], reason=event.reason, seconds=seconds)


def decided(book: Book, decision: Decision) -> Decided:
    """The event for ``decision`` on the trial as ``book`` has it now."""
    record = book.get(decision.trial)
    return Decided(decision, record.promotions if record is not None else None)


def fold_all(book: Book, events: Iterable[Event]) -> Book:
    """``fold`` of each event in turn (the book sorted once, at the end: a sweep of
    thousands of trials is folded afresh each reconcile)."""
    records = {r.index: r for r in book.trials}
    for event in events:
        index = _trial_of(event)
        records[index] = _step(book.goal, records.get(index), event)
    return replace(book, trials=tuple(records[i] for i in sorted(records)))


# The states HyperDrive's ``include_canceled=False`` leaves out: its early-terminated runs
# are Canceled, so a trial the policy stopped (or paused) counts as canceled here.
CANCELED_LIKE = frozenset({TrialState.STOPPED, TrialState.PAUSED, TrialState.CANCELED})


def best(
    book: Book, include_failed: bool = True, include_canceled: bool = True
) -> TrialRecord | None:
    """The best trial, the one rule of the sweep's summary and status, ``torchyard sweep
    best``, the SDK's ``get_best_run_by_primary_metric`` and ``registerBest``: as
    HyperDrive's ``get_best_run_by_primary_metric(include_failed=True,
    include_canceled=True)``, the trial with the best metric any trial reported (each
    trial's best finite value, by the goal; the lower index on a tie), whatever its state,
    unless left out: ``include_failed=False`` leaves out the failed trials,
    ``include_canceled=False`` those stopped, paused or canceled (``CANCELED_LIKE``).
    ``registerBest`` takes the best of those that completed (:func:`best_completed`)."""
    for record in ranked(book):
        if record.state is TrialState.FAILED and not include_failed:
            continue
        if record.state in CANCELED_LIKE and not include_canceled:
            continue
        return record
    return None


def best_completed(book: Book) -> TrialRecord | None:
    """What ``registerBest`` registers: :func:`best` among the trials that completed (a
    failed, stopped or canceled trial's outputs are not whole); None when none did with a
    finite metric."""
    done = [r for r in ranked(book) if r.state is TrialState.COMPLETED]
    return done[0] if done else None


def ranked(book: Book) -> list[TrialRecord]:
    """The trials that reported a finite metric, best first (lower index on a tie)."""
    sign = -1.0 if book.goal is Goal.MAXIMIZE else 1.0
    scored = [r for r in book.trials if r.best is not None]
    return sorted(scored, key=lambda r: (sign * (r.best or 0.0), r.index))


def counts(book: Book) -> dict[str, int]:
    """How many trials are in each state (every state named, zeros included)."""
    out = {state.value: 0 for state in TrialState}
    for record in book.trials:
        out[record.state.value] += 1
    return out


def seconds_spent(book: Book) -> float:
    return math.fsum(r.seconds for r in book.trials)


def seconds_saved(book: Book) -> float | None:
    """Trial-seconds early termination saved: for each trial stopped or paused before its
    planned intervals, its seconds per interval times the intervals it did not run. None
    while the planned length is unknown (no ``planned_intervals`` and no completed trial)."""
    planned = book.planned_intervals
    if planned is None:
        done = [r.intervals for r in book.trials if r.state is TrialState.COMPLETED]
        if not done:
            return None
        planned = max(done)
    saved = 0.0
    for r in book.trials:
        if r.state in (TrialState.STOPPED, TrialState.PAUSED) and 0 < r.intervals < planned:
            saved += r.seconds / r.intervals * (planned - r.intervals)
    return saved


def _row(record: TrialRecord) -> dict[str, Any]:
    row: dict[str, Any] = {
        "trial": record.index,
        "state": record.state.value,
        "parameters": record.params(),
        "intervals": record.intervals,
    }
    if record.best is not None:
        row["best"] = record.best
        row["bestInterval"] = record.best_interval
    if record.reason:
        row["reason"] = record.reason
    return row


def summary(book: Book, top: int = 5) -> dict[str, Any]:
    """The bounded part of the Sweep's status: counts per state, the best trial, the
    trial-seconds spent and saved, and the ``top`` best trials (a size that does not grow
    with the number of trials)."""
    out: dict[str, Any] = {
        "trials": {"total": len(book.trials), **counts(book)},
        "trialSeconds": {"spent": seconds_spent(book), "saved": seconds_saved(book)},
        "top": [_row(r) for r in ranked(book)[:top]],
    }
    found = best(book)
    if found is not None:
        out["best"] = _row(found)
    return out
