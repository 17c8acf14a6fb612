"""Sweeps as the SDK reads and changes them: a Sweep from a file (:func:`create`), one
by name (:func:`get`), its trials from its ledger (the ConfigMap ``<sweep>-trials``) or,
without one yet, its status (:func:`trials`), ranked by its goal (:func:`ranked`), the
best by the sweeps core's one rule (:func:`best`), the one line and the outcome a follower
shows, and :func:`cancel` (``spec.cancel``); the sweeps local mode ran, from their records
(:func:`recorded`, :func:`recorded_one`). Used by
``azureml.hyperdrive_runs`` (HyperDriveRun) and the ``torchyard sweep`` commands; tested
in tests/unit/sdk/test_hyperdrive.py and tests/unit/cli/test_sweep.py.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from torchyard import api, k8s
from torchyard.api import sweeps as sweep_api
from torchyard.planning import names
from torchyard.records import Query, Records, as_object
from torchyard.sweeps import trials as book_of
from torchyard.sweeps.space import format_value
from torchyard.sweeps.stopping import Goal

TERMINAL = ("Succeeded", "Failed")
FIELD_MANAGER = "torchyard-sweep-cancel"


class SweepNotFound(LookupError):
    """No Sweep of that name in the namespace."""


def get(namespace: str, name: str) -> dict[str, Any]:
    body = k8s.get_or_none(k8s.SWEEPS, namespace, name)
    if body is None:
        raise SweepNotFound(f"Sweep {namespace}/{name} not found")
    return body


def create(body: dict[str, Any]) -> dict[str, Any]:
    """Create the Sweep ``body`` (checked first: ``api.InvalidSpec`` names the field)."""
    api.parse_sweep(body)
    return k8s.create(body)


def ledger(namespace: str, name: str) -> dict[str, Any] | None:
    """The ConfigMap holding every trial of the Sweep (None before its first trial)."""
    return k8s.get_or_none(k8s.CONFIGMAPS, namespace, names.sweep_trials(name))


def trials(namespace: str, name: str) -> tuple[dict[str, Any], list[Trial]]:
    """The Sweep and its trials, by index."""
    body = get(namespace, name)
    return body, trials_of(body, ledger(namespace, name))


def finished(body: dict[str, Any]) -> bool:
    return (body.get("status") or {}).get("phase") in TERMINAL


def canceled(body: dict[str, Any]) -> bool:
    """Whether ``spec.cancel`` ended it (Failed, reason Canceled)."""
    st = body.get("status") or {}
    return st.get("phase") == "Failed" and reason(st) == sweep_api.CANCELED_REASON


def cancel(namespace: str, name: str) -> dict[str, Any]:
    """``spec.cancel: true``: the controller cancels the trials still running and ends the
    sweep Failed, reason Canceled. A finished sweep is refused (``ValueError``)."""
    body = get(namespace, name)
    st = body.get("status") or {}
    if finished(body) and st.get("completionTime"):
        raise ValueError(f"Sweep {namespace}/{name} already finished ({st['phase']})")
    patch = {
        "apiVersion": api.API_VERSION,
        "kind": "Sweep",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"cancel": True},
    }
    return k8s.apply(patch, field_manager=FIELD_MANAGER)


@dataclass(frozen=True)
class Trial:
    """One trial as the ledger (or, without it, the status) holds it."""

    name: str
    index: int
    state: str
    parameters: dict[str, str]
    history: list[float] = field(default_factory=list)  # the metric's values, by interval
    best: float | None = None
    reason: str = ""


def _best(values: list[float], goal: str) -> float | None:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return None
    return max(finite) if goal == "maximize" else min(finite)


def trials_of(sweep: dict[str, Any], ledger: dict[str, Any] | None) -> list[Trial]:
    """Every trial, by index: from the ledger's entries (``t<index>``: JSON), or from the
    status's summary rows when there is no ledger yet."""
    name = sweep["metadata"]["name"]
    goal = sweep["spec"]["objective"]["goal"]
    out: dict[int, Trial] = {}
    for key, text in ((ledger or {}).get("data") or {}).items():
        if not (key.startswith("t") and key[1:].isdigit()):
            continue
        try:
            raw = json.loads(text)
            history = [float(v) for _, v in raw.get("history", []) if v is not None]
            parameters = {k: format_value(v) for k, v in (raw.get("parameters") or {}).items()}
        except (ValueError, TypeError, AttributeError):
            continue
        index = int(key[1:])
        out[index] = Trial(
            names.trial(name, index),
            index,
            str(raw.get("state") or "Pending"),
            parameters,
            history,
            _best(history, goal),
            str(raw.get("reason") or ""),
        )
    status = sweep.get("status") or {}
    for row in [*(status.get("summary") or []), *([status["best"]] if status.get("best") else [])]:
        if row["index"] not in out:
            metric = row.get("metric")
            out[row["index"]] = Trial(
                row["name"],
                row["index"],
                row.get("state", "Pending"),
                dict(row.get("parameters") or {}),
                [] if metric is None else [float(metric)],
                metric,
                row.get("reason") or "",
            )
    return [out[i] for i in sorted(out)]


def ranked(trials: list[Trial], goal: str) -> list[Trial]:
    """Best first (by the goal); trials without a metric last, by index."""
    sign = -1.0 if goal == "maximize" else 1.0
    with_metric = sorted(
        (t for t in trials if t.best is not None), key=lambda t: (sign * (t.best or 0.0), t.index)
    )
    return with_metric + [t for t in trials if t.best is None]


def best(
    sweep: dict[str, Any],
    trials: list[Trial],
    include_failed: bool = True,
    include_canceled: bool = True,
) -> Trial | None:
    """The best trial by the sweeps core's one rule (``sweeps.trials.best``: HyperDrive's
    ``get_best_run_by_primary_metric``, every state unless ``include_failed`` or
    ``include_canceled`` leaves failed or stopped/canceled trials out); None while no
    trial it counts reported the metric."""
    states = {state.value: state for state in book_of.TrialState}
    book = book_of.Book(
        Goal(sweep["spec"]["objective"]["goal"]),
        trials=tuple(
            book_of.TrialRecord(
                t.index, (), states.get(t.state, book_of.TrialState.PENDING), best=t.best
            )
            for t in trials
        ),
    )
    found = book_of.best(book, include_failed, include_canceled)
    return None if found is None else next(t for t in trials if t.index == found.index)


def summary_line(sweep: dict[str, Any]) -> str:
    """The phase, the trial counts and the best trial in one line."""
    st = sweep.get("status") or {}
    counts = st.get("trials") or {}
    shown = ", ".join(
        f"{counts[k]} {k}"
        for k in ("pending", "running", "completed", "stopped", "failed", "canceled")
        if counts.get(k)
    )
    made = f"{counts.get('created', 0)}/{counts.get('planned', '?')} trials made"
    line = f"{st.get('phase') or 'Pending'} ({made}"
    line += f": {shown})" if shown else ")"
    best = st.get("best")
    if best and best.get("metric") is not None:
        metric = sweep["spec"]["objective"]["metric"]
        line += f"; best {best_name(best)} {metric} {best['metric']:.6g}"
    return line


def best_name(row: dict[str, Any]) -> str:
    """A status row's trial name, with its state when it ended without completing (``t3
    (Failed)``): the best trial may have failed or been stopped."""
    state = str(row.get("state"))
    incomplete = {s.value for s in book_of.ENDED_INCOMPLETE}
    return str(row["name"]) + (f" ({state})" if state in incomplete else "")


def outcome(sweep: dict[str, Any]) -> str:
    """The message of the condition the sweep finished with."""
    st = sweep.get("status") or {}
    for cond in st.get("conditions") or []:
        if cond.get("type") == st.get("phase") and cond.get("status") == "True":
            return f"Sweep {sweep['metadata']['name']} {st['phase']}: {cond.get('message', '')}"
    return f"Sweep {sweep['metadata']['name']} {st.get('phase') or 'Pending'}"


def reason(st: dict[str, Any]) -> str | None:
    """The reason of the condition the sweep's phase names."""
    for cond in st.get("conditions") or []:
        if cond.get("type") == st.get("phase"):
            return str(cond.get("reason") or "")
    return None


def list_(namespace: str) -> list[dict[str, Any]]:
    """Every Sweep of the namespace."""
    return k8s.list_(k8s.SWEEPS, namespace)


def recorded(source: Records, namespace: str, limit: int = 100) -> list[dict[str, Any]]:
    """The sweeps ``source`` holds records of (local mode's), newest first, each as the
    Sweep it was when it ended (its status has every trial in ``summary``)."""
    page = source.page(namespace, Query.of("Sweep", limit=limit))
    found = [source.get_record(namespace, str(s.get("name")), str(s.get("uid")), kind="Sweep")
             for s in page.items]  # fmt: skip
    return [_as_sweep(r) for r in found if r is not None]


def recorded_one(source: Records, namespace: str, name: str) -> dict[str, Any]:
    """The newest record of sweep ``name`` as the Sweep it was (SweepNotFound: none)."""
    found = source.get_record(namespace, name, kind="Sweep")
    if found is None:
        raise SweepNotFound(
            f"no record of a sweep {namespace}/{name} (torchyard sweep get --local)"
        )
    return _as_sweep(found)


def _as_sweep(record: Any) -> dict[str, Any]:
    return as_object(record, "Sweep")
