"""Sweep status as a table: what the controller observed and decided -> phase,
conditions, counts, best trial, bounded summary; a finished sweep stays finished; an
invalid spec is Failed with Accepted False naming the field."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from torchyard.status import sweeps

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
BEST = sweeps.Row(
    "hd-t2",
    2,
    "Completed",
    {"learning_rate": "0.0031", "momentum": "0.95"},
    metric=0.91,
    interval=12,
    intervals=15,
)
BASE = sweeps.Observed(
    seed=7,
    metric="best_val_acc",
    planned=8,
    created=4,
    counts={"Pending": 4},
    trials_config_map="hd-trials",
)


def conditions(st: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in st["conditions"]}


CASES: list[tuple[str, sweeps.Observed, str, dict[str, tuple[str, str]]]] = [
    (
        "trials made, none started",
        BASE,
        "Pending",
        {"Running": ("True", "TrialsPending"), "MetricReported": ("Unknown", "Waiting")},
    ),
    (
        "trials made that cannot start: why, from their own status",
        replace(
            BASE,
            waiting=("EnvironmentNotFound", "4 trial(s) cannot start yet; hd-t0, ...: ..."),
        ),
        "Pending",
        {
            "TrialsWaiting": ("True", "EnvironmentNotFound"),
            "Ready": ("False", "EnvironmentNotFound"),
            "Running": ("True", "TrialsPending"),
        },
    ),
    (
        "trials running and reporting",
        replace(
            BASE,
            counts={"Running": 3, "Pending": 1},
            metric_reported="hd-t0 reported best_val_acc first",
        ),
        "Running",
        {"Running": ("True", "TrialsRunning"), "MetricReported": ("True", "Reported")},
    ),
    (
        "trials ended without the metric",
        replace(BASE, counts={"Completed": 1, "Running": 3}, metric_missing="none reported it"),
        "Running",
        {"MetricReported": ("False", "MetricMissing"), "Reconciling": ("True", "TrialsRunning")},
    ),
    (
        "finished with a best trial",
        replace(
            BASE,
            created=8,
            counts={"Completed": 5, "Stopped": 3},
            best=BEST,
            metric_reported="hd-t0 reported best_val_acc first",
            verdict=sweeps.Verdict(True, "AllTrialsEnded", "all 8 trials ended"),
        ),
        "Succeeded",
        {
            "Succeeded": ("True", "AllTrialsEnded"),
            "Running": ("False", "AllTrialsEnded"),
            "Ready": ("True", "AllTrialsEnded"),
            "Stalled": ("False", "AllTrialsEnded"),
        },
    ),
    (
        "failed by too many failed trials",
        replace(
            BASE,
            counts={"Failed": 2, "Canceled": 2},
            failed_trials=["hd-t0", "hd-t2"],
            verdict=sweeps.Verdict(False, "TooManyFailedTrials", "2 trial(s) failed"),
        ),
        "Failed",
        {"Failed": ("True", "TooManyFailedTrials"), "Stalled": ("True", "TooManyFailedTrials")},
    ),
]


@pytest.mark.parametrize(
    ("observed", "phase", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_phase_and_conditions(
    observed: sweeps.Observed, phase: str, expected: dict[str, tuple[str, str]]
) -> None:
    st = sweeps.sweep_status(3, observed, None, T0)
    assert st["phase"] == phase
    assert st["observedGeneration"] == 3
    found = conditions(st)
    assert ("TrialsWaiting" in found) == (observed.waiting is not None)
    assert found["Accepted"]["status"] == "True"
    for type_, (status, reason) in expected.items():
        assert (found[type_]["status"], found[type_]["reason"]) == (status, reason), type_
    assert ("completionTime" in st) == (phase in ("Succeeded", "Failed"))


def test_counts_best_summary_and_seconds() -> None:
    observed = replace(
        BASE,
        created=8,
        counts={"Running": 2, "Stopped": 3, "Completed": 2, "Failed": 1},
        best=BEST,
        summary=[BEST, replace(BEST, name="hd-t5", index=5, state="Running", metric=None)],
        seconds_spent=5400.0,
        seconds_saved=1200.5,
        failed_trials=["hd-t1"],
    )
    st = sweeps.sweep_status(1, observed, None, T0)
    assert st["trials"] == {
        "planned": 8,
        "created": 8,
        "pending": 0,
        "running": 2,
        "paused": 0,
        "stopped": 3,
        "completed": 2,
        "failed": 1,
        "canceled": 0,
        "done": 6,
    }
    assert st["best"] == {
        "name": "hd-t2",
        "index": 2,
        "state": "Completed",
        "parameters": {"learning_rate": "0.0031", "momentum": "0.95"},
        "metric": 0.91,
        "interval": 12,
        "intervals": 15,
    }
    assert [r["name"] for r in st["summary"]] == ["hd-t2", "hd-t5"]
    assert "metric" not in st["summary"][1]
    assert st["trialSeconds"] == {"spent": 5400.0, "saved": 1200.5}
    assert st["failedTrials"] == ["hd-t1"]
    assert (st["seed"], st["trialsConfigMap"]) == (7, "hd-trials")


def test_the_same_observation_gives_the_same_status_later() -> None:
    """So the controller writes nothing when nothing changed (times carried over)."""
    first = sweeps.sweep_status(1, BASE, None, T0)
    again = sweeps.sweep_status(1, BASE, first, T0 + timedelta(minutes=5))
    assert again == first


def test_a_finished_sweep_stays_finished() -> None:
    done = sweeps.sweep_status(
        1, replace(BASE, verdict=sweeps.Verdict(True, "AllTrialsEnded", "done")), None, T0
    )
    later = sweeps.sweep_status(2, replace(BASE, counts={"Running": 4}), done, T0)
    assert later == {**done, "observedGeneration": 2}


def test_an_invalid_spec_is_failed_and_not_accepted_naming_the_field() -> None:
    message = "spec.maxTotalTrials: the grid has 9 combinations, more than maxTotalTrials 8"
    st = sweeps.invalid_sweep_status(4, message, None, T0)
    assert st["phase"] == "Failed"
    assert "completionTime" not in st  # a fixed spec is taken up again
    found = conditions(st)
    assert (found["Accepted"]["status"], found["Accepted"]["reason"]) == ("False", "InvalidSpec")
    assert found["Accepted"]["message"] == message
    assert found["Stalled"]["status"] == "True"
    # fixed: valid again, Accepted True
    fixed = sweeps.sweep_status(5, BASE, st, T0)
    assert conditions(fixed)["Accepted"]["status"] == "True" and fixed["phase"] == "Pending"


@pytest.mark.parametrize(
    ("status", "settled"),
    [
        ({"phase": "Running", "trials": {"planned": 500, "created": 500, "paused": 0}}, True),
        ({"phase": "Pending", "trials": {"planned": 500, "created": 500}}, True),
        # trials left to make: a trial's end makes the next one, at once
        ({"phase": "Running", "trials": {"planned": 500, "created": 50, "paused": 0}}, False),
        # a paused trial may be promoted into the freed place (ASHA)
        ({"phase": "Running", "trials": {"planned": 64, "created": 64, "paused": 2}}, False),
        # finished: its registration or record may be due
        ({"phase": "Succeeded", "trials": {"planned": 8, "created": 8, "paused": 0}}, False),
        ({"phase": "Failed", "trials": {"planned": 8, "created": 8}}, False),
        # not reconciled yet, or a status it cannot read
        ({}, False),
        (None, False),
        ({"phase": "Running", "trials": {"planned": "500", "created": 500}}, False),
    ],
)
def test_a_sweep_is_settled_when_its_next_reconcile_only_keeps_its_books(
    status: dict[str, Any] | None, settled: bool
) -> None:
    assert sweeps.keeps_books_only(status) is settled


def test_the_pinned_model_versions_are_listed_and_kept_by_an_invalid_spec() -> None:
    pins = [{"name": "base", "uri": "model://birds/3", "revision": "3"}]
    st = sweeps.sweep_status(1, replace(BASE, inputs=pins), None, T0)
    assert st["inputs"] == pins
    assert "inputs" not in sweeps.sweep_status(1, BASE, None, T0)
    assert sweeps.invalid_sweep_status(2, "spec.trial: refused", st, T0)["inputs"] == pins
