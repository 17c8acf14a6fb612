"""A Sweep's trials as the controller sees them, and the ledger that remembers them.

Each trial is a TrainingRun; what it shows is read into a :class:`Seen` (:func:`seen`):
its phase, whether it started, the Sweep's decision its annotations record, its
trial-seconds, and the objective's metric at the step it reached (``status.progress``:
the step is the evaluation interval, so a script reports its metric with the epoch as the
step, ``progress.report(epoch, best_val_acc=...)``). A TrainingRun's status keeps only
the last value of each metric, so the ledger, the ConfigMap ``<sweep>-trials``, keeps
what the early-termination policies compare: the metric at every step the operator saw
(:class:`Entry`, one key per trial, with the trial's parameters, state and reason for
whoever reads it). :func:`book` folds a reconcile's view into the sweeps core's book of
trials (``sweeps.trials``) from scratch, so it holds the same after an operator restart;
:func:`dense` turns a ledger history into one value per interval for the policies.
:func:`row` is a trial's status row, as the controller and local mode show it.

Pure (the controller reads and writes); tested in tests/unit/controller/test_sweep_policy.py
and, through the reconcile, tests/unit/controller/test_sweeps.py.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from torchyard.api import wire
from torchyard.api.times import parse_time
from torchyard.planning import names
from torchyard.planning import sweeps as sweep_manifests
from torchyard.status import sweeps as sweep_status
from torchyard.sweeps import trials
from torchyard.sweeps.space import Value, format_value
from torchyard.sweeps.stopping import Action, Decision, Goal

# Steps of a trial's metric the ledger keeps: beyond it, evenly spaced ones (the first
# and the last always), so that the ConfigMap stays well within its 1 MiB.
MAX_HISTORY = 500
ENDED_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Entry:
    """A trial in the ledger: its parameters, the metric at each step seen (step, value;
    None: reported but not a number), and the last interval the policy judged it at;
    ``state``, ``reason``, ``seconds`` are written for readers, not read back."""

    parameters: Mapping[str, Value]
    history: tuple[tuple[int, float | None], ...] = ()
    evaluated: int = 0
    state: str = "Pending"
    reason: str = ""
    seconds: float = 0.0
    # ASHA: the rungs it was recorded at, (sequence, milestone, score), the sequence
    # numbering every recording of the sweep in the order it was made (read back)
    rungs: tuple[tuple[int, float, float], ...] = ()

    def last_step(self) -> int:
        return self.history[-1][0] if self.history else 0


def key(index: int) -> str:
    return f"t{index}"


def decode(data: Mapping[str, str] | None) -> dict[int, Entry]:
    """The ledger's entries by index (keys it cannot read are left out: a trial without
    an entry gets one again from its TrainingRun)."""
    out: dict[int, Entry] = {}
    for name, text in (data or {}).items():
        if not (name.startswith("t") and name[1:].isdigit()):
            continue
        try:
            raw = json.loads(text)
            history = tuple(
                (int(step), None if value is None else float(value))
                for step, value in raw.get("history", [])
            )
            out[int(name[1:])] = Entry(
                parameters=dict(raw.get("parameters") or {}),
                history=history,
                evaluated=int(raw.get("evaluated") or 0),
                rungs=tuple(
                    (int(seq), float(milestone), float(score))
                    for seq, milestone, score in raw.get("rungs") or []
                ),
                state=str(raw.get("state") or "Pending"),
                reason=str(raw.get("reason") or ""),
                seconds=float(raw.get("seconds") or 0.0),
            )
        except (ValueError, TypeError, AttributeError):
            continue
    return out


def _record(entry: Entry, history: tuple[tuple[int, float | None], ...]) -> str:
    record: dict[str, Any] = {
        "parameters": {name: entry.parameters[name] for name in sorted(entry.parameters)},
        "state": entry.state,
        "seconds": entry.seconds,
        "evaluated": entry.evaluated,
        "history": [[step, value] for step, value in history],
    }
    if entry.reason:
        record["reason"] = entry.reason
    if entry.rungs:
        record["rungs"] = [list(r) for r in entry.rungs]
    return json.dumps(record, separators=(",", ":"))


def encode(entries: Mapping[int, Entry], budget: int | None = None) -> dict[str, str]:
    """The ledger's data: one compact JSON text per trial. Over ``budget`` bytes, every
    history is thinned to fewer steps (half as many each time, the first and the last
    kept) until it fits."""
    keep = MAX_HISTORY
    while True:
        out = {
            key(i): _record(entries[i], _thin(list(entries[i].history), keep))
            for i in sorted(entries)
        }
        size = sum(len(k) + len(v) for k, v in out.items())
        if budget is None or size <= budget or keep <= 2:
            return out
        keep //= 2


@dataclass(frozen=True)
class Seen:
    """One trial TrainingRun as a reconcile saw it."""

    index: int
    name: str
    phase: str | None
    parameters: Mapping[str, Value] | None  # from its annotation
    decision: sweep_manifests.Decision | None
    started: bool
    seconds: float
    step: int | None = None  # status.progress.step, when the metric was there
    value: float | None = None  # the metric at that step
    total: int | None = None  # status.progress.total
    metrics: tuple[str, ...] = ()  # the metric names its progress holds
    failure: str = ""
    # made but not started: what it waits for, its Ready condition's (reason, message)
    waiting: tuple[str, str] | None = None

    @property
    def ended(self) -> bool:
        return self.phase in ENDED_PHASES

    @property
    def occupies(self) -> bool:
        """Whether it holds one of maxConcurrentTrials: until it ended, or, stopped,
        canceled or paused by the sweep, until its gang is gone (Suspended); promoted, at
        once (it waits to be resumed)."""
        if self.ended:
            return False
        if self.decision is None or self.decision.what == "promoted":
            return True
        return self.phase != "Suspended"


def _seconds(st: Mapping[str, Any], units: int) -> float:
    """Trial-seconds from its status' times: from startTime to completionTime, to when it
    was suspended, or (running) to its last progress; times ``units`` (GPUs, else nodes)."""
    start = parse_time(st.get("startTime"))
    progress = st.get("progress") or {}
    end = (
        parse_time(st.get("completionTime"))
        or parse_time(st.get("suspendedSince"))
        or parse_time(progress.get("lastProgressTime"))
    )
    if start is None or end is None:
        return 0.0
    return max(0.0, (end - start).total_seconds()) * units


def _units(spec: Mapping[str, Any]) -> int:
    nodes = int((spec.get("distribution") or {}).get("nodeCount") or 1)
    gpus = int((spec.get("resources") or {}).get("gpusPerNode") or 0)
    return nodes * gpus if gpus else nodes


def _parameters(meta: Mapping[str, Any]) -> dict[str, Value] | None:
    text = (meta.get("annotations") or {}).get(wire.ANNOTATION_PARAMETERS)
    try:
        found = json.loads(text) if text else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _failure(st: Mapping[str, Any]) -> str:
    for cond in st.get("conditions") or []:
        if cond.get("type") == "Failed" and cond.get("status") == "True":
            return str(cond.get("message") or cond.get("reason") or "")
    return ""


# The phases of a trial that has not started and will (Pending, Preparing, Queued)
NOT_STARTED = ("Pending", "Preparing", "Queued")


def _waiting(st: Mapping[str, Any]) -> tuple[str, str] | None:
    """What a trial that has not started waits for: its Ready condition's reason and
    message (the last fact its status holds: EnvironmentNotFound, InputSecretNotReady,
    Queued ...); None once it started or before its first status."""
    if (st.get("phase") or "Pending") not in NOT_STARTED or st.get("startTime"):
        return None
    for cond in st.get("conditions") or []:
        if cond.get("type") == "Ready" and cond.get("status") != "True" and cond.get("reason"):
            return str(cond["reason"]), str(cond.get("message") or "")
    return None


def seen(trial_run: Mapping[str, Any], index: int, metric: str) -> Seen:
    """What ``trial_run`` (trial ``index``) shows."""
    meta = trial_run.get("metadata") or {}
    st = trial_run.get("status") or {}
    phase = st.get("phase")
    progress = st.get("progress") or {}
    metrics = progress.get("metrics") or {}
    value = metrics.get(metric)
    step = progress.get("step")
    number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
    has_step = isinstance(step, int) and not isinstance(step, bool)
    total = progress.get("total")
    return Seen(
        index=index,
        name=str(meta.get("name") or ""),
        phase=phase,
        parameters=_parameters(meta),
        decision=sweep_manifests.decision_of(trial_run),
        started=bool(st.get("startTime")) or phase in ("Running", "Finalizing", *ENDED_PHASES),
        seconds=_seconds(st, _units(trial_run.get("spec") or {})),
        step=step if number is not None and has_step else None,
        value=float(number) if number is not None else None,
        total=total if isinstance(total, int) and not isinstance(total, bool) else None,
        metrics=tuple(sorted(str(k) for k in metrics)),
        failure=_failure(st) if phase == "Failed" else "",
        waiting=_waiting(st),
    )


def owned(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether the Sweep of ``uid`` owns ``obj`` (a trial, the ledger)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == uid for r in refs)


def existing_parameters(
    trial_run: Mapping[str, Any], uid: str, planned: Mapping[str, Value]
) -> Mapping[str, Value] | None:
    """The parameters of a trial that its Sweep's create found made already (409
    AlreadyExists: the view the reconcile read was older than the apiserver's): those its
    annotation records when the Sweep of ``uid`` owns it (``planned``, those it would be
    made with, when the annotation cannot be read); None when another Sweep of the same
    name made it (a namesake, being garbage collected)."""
    if not owned(trial_run, uid):
        return None
    return _parameters(trial_run.get("metadata") or {}) or planned


def sweep_reads(trial_run: Mapping[str, Any]) -> bytes:
    """A digest of what the trial's Sweep reads of it (:func:`seen`, its index, owner and
    spec; every part of its status but its place in the queue and the conditions other
    than ``Failed``): an event that leaves it as it was (a queued trial moved up, a
    condition's message changed) need not queue the Sweep."""
    meta = trial_run.get("metadata") or {}
    st = trial_run.get("status") or {}
    read = {
        "labels": meta.get("labels"),
        "annotations": meta.get("annotations"),
        "owners": meta.get("ownerReferences"),
        "deleting": meta.get("deletionTimestamp"),
        "spec": trial_run.get("spec"),
        "status": {k: v for k, v in st.items() if k not in ("queue", "conditions")},
        "failed": [c for c in st.get("conditions") or [] if c.get("type") == "Failed"],
        "waiting": _waiting(st),
    }
    text = json.dumps(read, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def _thin(
    history: list[tuple[int, float | None]], keep: int = MAX_HISTORY
) -> tuple[tuple[int, float | None], ...]:
    """At most ``keep`` of the steps, evenly spaced, the first and the last among them."""
    if len(history) <= keep:
        return tuple(history)
    last = len(history) - 1
    picks = sorted({round(i * last / (keep - 1)) for i in range(keep)})
    return tuple(history[i] for i in picks)


def observed(entry: Entry, trial: Seen) -> Entry:
    """``entry`` with the metric ``trial`` shows now (a new step, or a new value at its
    last step); steps from 1 on are intervals (step 0 comes before the first)."""
    if trial.step is None or trial.step < 1:
        return entry
    value = trial.value if trial.value is None or math.isfinite(trial.value) else None
    points = dict(entry.history)
    if points.get(trial.step, "absent") == value:
        return entry
    points[trial.step] = value
    return replace(entry, history=_thin(sorted(points.items())))


def dense(history: Iterable[tuple[int, float | None]], upto: int) -> list[float | None]:
    """One value per interval 1..``upto``: the value at the latest step seen at or before
    it, and before the first step seen, that first value (the operator reads a trial's
    progress at most every few seconds and may miss a step)."""
    points = sorted(history)
    if not points:
        return []
    out: list[float | None] = []
    at, value = 0, points[0][1]
    for interval in range(1, upto + 1):
        while at < len(points) and points[at][0] <= interval:
            value = points[at][1]
            at += 1
        out.append(value)
    return out


def book(
    goal: Goal,
    entries: Mapping[int, Entry],
    trial_runs: Mapping[int, Seen],
    planned_intervals: int | None = None,
) -> trials.Book:
    """The book of trials from the ledger and the trials' TrainingRuns, folded afresh."""
    events: list[trials.Event] = []
    for index in sorted(set(entries) | set(trial_runs)):
        entry = entries.get(index)
        run = trial_runs.get(index)
        parameters = (run.parameters if run is not None else None) or (
            entry.parameters if entry is not None else {}
        )
        events.append(trials.Created(index, parameters))
        seconds = run.seconds if run is not None else (entry.seconds if entry else 0.0)
        if run is None:
            events.append(trials.Ended(index, "canceled", seconds, "its TrainingRun was deleted"))
            continue
        if run.started:
            events.append(trials.Started(index))
        for step, value in entry.history if entry is not None else ():
            events.append(trials.Reported(index, step, value, seconds))
        events += _promotions(index, run)
        if run.decision is not None and run.decision.what == "stopped":
            events.append(trials.Decided(Decision(index, Action.STOP, run.decision.reason)))
        elif run.decision is not None and run.decision.what == "paused":
            events.append(trials.Decided(Decision(index, Action.PAUSE, run.decision.reason)))
        elif run.decision is not None and run.decision.what == "canceled":
            events.append(trials.Ended(index, "canceled", seconds, run.decision.reason))
        elif run.phase == "Succeeded":
            events.append(trials.Ended(index, "completed", seconds))
        elif run.phase == "Failed":
            events.append(trials.Ended(index, "failed", seconds, run.failure))
    return trials.fold_all(trials.Book(goal, planned_intervals), events)


def _promotions(index: int, run: Seen) -> list[trials.Event]:
    """ASHA's pauses and promotions of a trial before its current decision, and, promoted
    last, its start again once its gang runs."""
    count = run.decision.promotions if run.decision is not None else 0
    events: list[trials.Event] = []
    for _ in range(count):
        events.append(trials.Decided(Decision(index, Action.PAUSE, "paused by asha")))
        events.append(trials.Decided(Decision(index, Action.PROMOTE, "promoted by asha")))
    resumed = run.phase in ("Running", "Finalizing", *ENDED_PHASES)
    if count and run.decision is not None and run.decision.what == "promoted" and resumed:
        events.append(trials.Started(index))
    return events


# Trials a TrialsWaiting message names, and reasons it tells apart
NAMED_WAITING = 5


def waiting(trial_runs: Mapping[int, Seen]) -> tuple[str, str] | None:
    """Why the trials made but not started wait, as the Sweep's ``TrialsWaiting`` condition
    says it: (the reason of the first of them, by index; a message naming the trials of
    each reason with the first one's message), None when none waits. A trial the sweep
    stopped, paused or canceled does not wait."""
    by_reason: dict[str, list[tuple[str, str]]] = {}
    for index in sorted(trial_runs):
        run = trial_runs[index]
        held = run.decision is not None and run.decision.what != "promoted"
        if run.waiting is not None and not held:
            reason, message = run.waiting
            by_reason.setdefault(reason, []).append((run.name, message))
    if not by_reason:
        return None
    count = sum(len(found) for found in by_reason.values())
    parts = []
    for reason, found in list(by_reason.items())[:NAMED_WAITING]:
        named = ", ".join(name for name, _ in found[:NAMED_WAITING])
        more = f" and {len(found) - NAMED_WAITING} more" if len(found) > NAMED_WAITING else ""
        parts.append(f"{named}{more}: {reason}: {found[0][1]}")
    return next(iter(by_reason)), f"{count} trial(s) cannot start yet; " + "; ".join(parts)


def shown(parameters: Mapping[str, Value]) -> dict[str, str]:
    """Parameters as the trial received them (``--name value``)."""
    return {name: format_value(parameters[name]) for name in sorted(parameters)}


def now_entry(entry: Entry, record: trials.TrialRecord) -> Entry:
    """``entry`` with the book's state, reason and seconds, for the ledger's readers."""
    return replace(
        entry, state=record.state.value, reason=record.reason, seconds=round(record.seconds, 1)
    )


def started_at(st: Mapping[str, Any], now: datetime) -> datetime:
    """When the sweep started (``status.startTime``, else now)."""
    return parse_time(st.get("startTime")) or now


def status_row(sweep: str, record: trials.TrialRecord) -> sweep_status.Row:
    """The row of a trial in its Sweep's status (the controller's and local mode's)."""
    return sweep_status.Row(
        name=names.trial(sweep, record.index),
        index=record.index,
        state=record.state.value,
        parameters=shown(record.params()),
        metric=record.best,
        interval=record.best_interval,
        intervals=record.intervals,
        reason=record.reason,
    )
