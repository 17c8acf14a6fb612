"""Sweep status as pure functions of what the controller observed and decided.

:func:`sweep_status` turns one reconcile's :class:`Observed` (the counts of trials by
state, the best trial, the bounded summary rows, the trial-seconds, whether the metric was
reported, and the verdict once the sweep finished, decided by ``tuning.sweep_policy``
and carried here, never computed again) into the status the controller writes when it
changed: phase ``Pending`` (no trial started yet), ``Running``, ``Succeeded`` or
``Failed``; ``inputs``, the model versions its trials were pinned to; conditions
``Accepted``, ``MetricReported``, ``Running``, ``TrialsWaiting`` (while trials made have
not started: what they wait for, as their own Ready conditions say it, e.g.
``EnvironmentNotFound``), ``Succeeded`` / ``Failed`` and the kstatus ones (``Ready``,
``Reconciling``, ``Stalled``).
:func:`invalid_sweep_status` is the status of a spec the controller cannot run (Accepted
False, reason InvalidSpec, the message naming the field). A finished sweep's status stays
as it was. Called by ``controller.sweeps``; tested as tables in
tests/unit/status/test_sweep_status.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from torchyard.api.sweeps import STATUS_FAILED_NAMES
from torchyard.status.conditions import condition, invalid_spec_status, merge, timestamp
from torchyard.status.trainingruns import with_kstatus

TERMINAL = ("Succeeded", "Failed")
# The trial states of sweeps.trials.TrialState, as status.trials counts them.
COUNTED = {
    "Pending": "pending",
    "Running": "running",
    "Paused": "paused",
    "Stopped": "stopped",
    "Completed": "completed",
    "Failed": "failed",
    "Canceled": "canceled",
}
ENDED = ("Stopped", "Completed", "Failed", "Canceled")
# While trials made have not started: why (the first one's reason, each one's message)
TRIALS_WAITING = "TrialsWaiting"
# What the status of a spec the controller cannot run keeps of the one before
KEPT_WHEN_INVALID = ("seed", "trials", "best", "trialsConfigMap", "inputs")


@dataclass(frozen=True)
class Row:
    """One trial as the status shows it."""

    name: str
    index: int
    state: str
    parameters: Mapping[str, str] = field(default_factory=dict)
    metric: float | None = None  # its best value of the objective's metric
    interval: int | None = None  # where it reported that best value
    intervals: int | None = None  # the last interval it reported
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "index": self.index,
            "state": self.state,
            "parameters": dict(sorted(self.parameters.items())),
        }
        if self.metric is not None:
            out["metric"] = self.metric
        if self.interval is not None:
            out["interval"] = self.interval
        if self.intervals:
            out["intervals"] = self.intervals
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True)
class Verdict:
    """How the sweep finished, as the controller decided it."""

    succeeded: bool
    reason: str  # AllTrialsEnded, MaxDurationReached, TooManyFailedTrials, MetricMissing ...
    message: str


@dataclass(frozen=True)
class Observed:
    """What one reconcile saw and decided of a valid sweep."""

    seed: int
    metric: str
    planned: int  # trials in all (maxTotalTrials, or a smaller grid)
    created: int  # trials made so far
    counts: Mapping[str, int]  # trials by state (sweeps.trials.counts)
    trials_config_map: str
    best: Row | None = None
    summary: Sequence[Row] = ()
    seconds_spent: float = 0.0
    seconds_saved: float | None = None
    failed_trials: Sequence[str] = ()
    # None: no trial reported the metric yet; else the message of MetricReported
    metric_reported: str | None = None
    # why no trial reports the metric, once some trial ended without it
    metric_missing: str | None = None
    verdict: Verdict | None = None  # set once the sweep finished
    # valid but likely mistaken (sweeps.space.hints: a loguniform's bounds that look like
    # the values rather than their logarithms), said in Accepted
    hints: Sequence[str] = ()
    # the trial template's model:// inputs that name no version, as every trial got them
    # pinned (name, uri, revision)
    inputs: Sequence[Mapping[str, str]] = ()
    # what the trials made but not started wait for (reason, message:
    # tuning.sweep_trials.waiting), said in TrialsWaiting
    waiting: tuple[str, str] | None = None


def keeps_books_only(status: Mapping[str, Any] | None) -> bool:
    """Whether a sweep's status says its next reconcile only keeps its books: every trial
    made, none paused (waiting for ASHA to promote it), not finished. Its trials' events
    then queue it a moment later (``controller.handlers``), not at once."""
    st = status or {}
    counts = st.get("trials") or {}
    planned, created = counts.get("planned"), counts.get("created")
    if not isinstance(planned, int) or not isinstance(created, int):
        return False
    return created >= planned and not counts.get("paused") and st.get("phase") not in TERMINAL


def _counts(observed: Observed) -> dict[str, int]:
    out = {"planned": observed.planned, "created": observed.created}
    for state, key in COUNTED.items():
        out[key] = int(observed.counts.get(state, 0))
    out["done"] = sum(int(observed.counts.get(state, 0)) for state in ENDED)
    return out


def _metric_condition(observed: Observed, gen: int | None) -> dict[str, Any]:
    if observed.metric_reported is not None:
        return condition(
            "MetricReported", True, "Reported", observed.metric_reported, observed_generation=gen
        )
    if observed.metric_missing is not None:
        return condition(
            "MetricReported",
            False,
            "MetricMissing",
            observed.metric_missing,
            observed_generation=gen,
        )
    return condition(
        "MetricReported",
        "Unknown",
        "Waiting",
        f"no trial has reported {observed.metric} yet",
        observed_generation=gen,
    )


def _running_message(counts: Mapping[str, int]) -> str:
    paused = f", {counts['paused']} paused" if counts["paused"] else ""
    return (
        f"{counts['running']} trial(s) running, {counts['pending']} waiting to start"
        f"{paused}, {counts['done']} of {counts['planned']} done"
    )


def sweep_status(
    generation: int | None,
    observed: Observed,
    previous: Mapping[str, Any] | None,
    now: datetime,
) -> dict[str, Any]:
    """The whole status of a valid sweep (see the module docstring)."""
    prev = dict(previous or {})
    if prev.get("phase") in TERMINAL and prev.get("completionTime"):
        return {**prev, "observedGeneration": generation}  # a finished sweep stays finished
    counts = _counts(observed)
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "seed": observed.seed,
        "trials": counts,
        "trialsConfigMap": observed.trials_config_map,
        "trialSeconds": {"spent": observed.seconds_spent},
        "startTime": prev.get("startTime") or timestamp(now),
    }
    if observed.seconds_saved is not None:
        status["trialSeconds"]["saved"] = observed.seconds_saved
    if observed.best is not None:
        status["best"] = observed.best.to_dict()
    if observed.summary:
        status["summary"] = [row.to_dict() for row in observed.summary]
    if observed.failed_trials:
        status["failedTrials"] = list(observed.failed_trials)[:STATUS_FAILED_NAMES]
    if observed.inputs:
        status["inputs"] = [dict(pin) for pin in observed.inputs]
    accepted = "the spec is valid"
    if observed.hints:
        accepted += "; but " + "; ".join(observed.hints)
    desired = [
        condition("Accepted", True, "Valid", accepted, observed_generation=generation),
        _metric_condition(observed, generation),
    ]
    verdict = observed.verdict
    if verdict is None:
        started = counts["running"] + counts["done"] > 0
        status["phase"] = "Running" if started else "Pending"
        reason = "TrialsRunning" if started else "TrialsPending"
        message = _running_message(counts)
        desired.append(condition("Running", True, reason, message, observed_generation=generation))
        if observed.waiting is not None:  # last: Ready (kstatus) then says why
            reason, message = observed.waiting
            desired.append(
                condition(TRIALS_WAITING, True, reason, message, observed_generation=generation)
            )
    else:
        status["phase"] = "Succeeded" if verdict.succeeded else "Failed"
        status["completionTime"] = timestamp(now)
        reason, message = verdict.reason, verdict.message
        desired += [
            condition("Running", False, reason, message, observed_generation=generation),
            condition(status["phase"], True, reason, message, observed_generation=generation),
        ]
    status["conditions"] = merge(prev.get("conditions"), desired, now)
    return with_kstatus(status, prev, now)


def invalid_sweep_status(
    generation: int | None, message: str, previous: Mapping[str, Any] | None, now: datetime
) -> dict[str, Any]:
    """A spec the controller cannot run: the one InvalidSpec status, keeping what the sweep
    already pinned and found (no completionTime: a fixed spec is taken up again)."""
    prev = previous or {}
    kept = {k: v for k, v in prev.items() if k in KEPT_WHEN_INVALID}
    return invalid_spec_status(generation, message, prev, now, fields=kept)


MODEL_REGISTERED = "ModelRegistered"


def with_model(
    status: Mapping[str, Any],
    registered: bool | str,
    reason: str,
    message: str,
    now: datetime,
    model: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A succeeded sweep's ``status`` with what ``spec.registerBest`` did: the condition
    ``ModelRegistered`` (True: ``status.model`` names the version and its trial; Unknown:
    waiting for the registry, tried again; False: nothing to register, said why), placed
    before ``Succeeded`` so that Ready keeps the sweep's own reason."""
    gen = status.get("observedGeneration")
    desired = condition(MODEL_REGISTERED, registered, reason, message, observed_generation=gen)
    [merged] = merge(status.get("conditions"), [desired], now)
    others = [c for c in status.get("conditions") or [] if c.get("type") != MODEL_REGISTERED]
    at = next((i for i, c in enumerate(others) if c.get("type") == "Succeeded"), len(others))
    out = {**status, "conditions": [*others[:at], merged, *others[at:]]}
    if model is not None:
        out["model"] = dict(model)
    return out


def registration_pending(status: Mapping[str, Any]) -> bool:
    """Whether a sweep's registration is still to be done: it succeeded, and its
    ``ModelRegistered`` condition is not there yet or says it waits (Unknown)."""
    if status.get("phase") != "Succeeded" or status.get("model"):
        return False
    found = next(
        (c for c in status.get("conditions") or [] if c.get("type") == MODEL_REGISTERED), None
    )
    return found is None or found.get("status") == "Unknown"
