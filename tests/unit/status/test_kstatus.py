"""The conditions GitOps tools read (kstatus: observedGeneration, Ready, Reconciling,
Stalled), the Events phase changes deserve, and ModelVersion's Available condition: pure
functions of what the operator observed, as tables."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tests.builders import environment, pod
from tests.unit.status.test_trainingrun_status import T0, TABLE, compute, run_2x2
from torchyard import api, status
from torchyard.status.trainingruns import Observed

KSTATUS: dict[str, tuple[str, str, str]] = {
    # case of test_trainingrun_status.TABLE -> (Ready, Reconciling, Stalled)
    "environment missing": ("False", "True", "False"),
    "environment building": ("False", "True", "False"),
    "environment failed": ("False", "False", "True"),
    "pods being created": ("False", "True", "False"),
    "gang waiting for capacity": ("False", "True", "False"),
    "admitted, not yet bound": ("False", "True", "False"),
    "all running": ("False", "True", "False"),
    "all succeeded": ("True", "False", "False"),
    "one rank failed": ("False", "False", "True"),
    "image cannot be pulled": ("False", "False", "True"),
    "deadline exceeded": ("False", "False", "True"),
}


def kstatus_of(st: dict[str, Any]) -> tuple[str, str, str]:
    found = {c["type"]: c["status"] for c in st["conditions"]}
    return found["Ready"], found["Reconciling"], found["Stalled"]


def test_every_status_case_is_covered() -> None:
    assert set(KSTATUS) == {row[0] for row in TABLE}


@pytest.mark.parametrize(("case", "kw", "phase", "_"), TABLE, ids=[t[0] for t in TABLE])
def test_trainingrun_kstatus_conditions(
    case: str, kw: dict[str, Any], phase: str, _: object
) -> None:
    st = compute(**kw)
    assert kstatus_of(st) == KSTATUS[case], st["conditions"]
    assert st["observedGeneration"] == 3
    by_type = {c["type"]: c for c in st["conditions"]}
    # Their reason and message are those of the most advanced condition of the phase.
    own = [c for c in st["conditions"] if c["type"] not in ("Ready", "Reconciling", "Stalled")]
    for type_ in ("Ready", "Reconciling", "Stalled"):
        assert by_type[type_]["reason"] == own[-1]["reason"]
        assert by_type[type_]["message"] == own[-1]["message"]
        assert by_type[type_]["observedGeneration"] == 3


def test_recomputing_the_same_status_keeps_transition_times() -> None:
    first = compute([], env=None)
    later = T0 + timedelta(minutes=5)
    again = status.trainingrun_status(run_2x2(), Observed(environment=None), first, later)
    assert again == first


def test_a_restarting_gang_is_reconciling_and_no_longer_admitted() -> None:
    running = compute([], env={"status": {"phase": "Ready"}})
    st = status.restarting_status(
        running, 3, restarts=1, failed_attempts=1, message="restarting the gang", now=T0
    )
    by_type = {c["type"]: (c["status"], c["reason"]) for c in st["conditions"]}
    assert st["phase"] == "Pending"
    assert (st["restarts"], st["failedAttempts"]) == (1, 1)
    assert "Admitted" not in by_type
    assert by_type["Running"] == ("False", "Restarting")
    assert by_type["Reconciling"] == ("True", "Restarting")
    assert by_type["Stalled"] == ("False", "Restarting")
    assert by_type["Ready"] == ("False", "Restarting")


def test_a_restarting_gang_counts_none_of_the_failed_attempts_pods() -> None:
    """``status.nodes`` is the new attempt's: a client waiting for "restarted and one node
    running" does not take the old attempt's Running Pod for the new one's."""
    pods = [pod("r", 0, phase="Running", node_name="n0"), pod("r", 1, phase="Pending")]
    running = compute(pods)
    assert running["nodes"]["running"] == 1
    st = status.restarting_status(
        running, 3, restarts=1, failed_attempts=1, message="restarting the gang", now=T0
    )
    assert st["nodes"] == {
        "total": 2,
        "scheduled": 0,
        "running": 0,
        "succeeded": 0,
        "failed": 0,
        "ready": "0/2",
    }


def test_an_invalid_run_is_stalled() -> None:
    st = status.invalid_trainingrun_status(2, "command must not be empty", None, T0)
    assert kstatus_of(st) == ("False", "False", "True")
    stalled = next(c for c in st["conditions"] if c["type"] == "Stalled")
    assert (stalled["reason"], stalled["message"]) == ("InvalidSpec", "command must not be empty")


BUILD = {"baseImage": "python:3.11-slim", "pip": ["torch"], "registry": {"repository": "r/e"}}
ENVIRONMENTS: list[tuple[str, dict[str, Any], status.BuildObserved | None, tuple[str, ...]]] = [
    ("curated", {"image": "python:3.11-slim"}, None, ("Ready", "True", "False", "False")),
    ("waiting for the plan", BUILD, None, ("Pending", "False", "True", "False")),
    (
        "building",
        BUILD,
        status.BuildObserved("sha256:1", job="b", job_state="Running"),
        ("Building", "False", "True", "False"),
    ),
    (
        "cached",
        BUILD,
        status.BuildObserved("sha256:1", image="r/e@sha256:2"),
        ("Ready", "True", "False", "False"),
    ),
    (
        "build failed",
        BUILD,
        status.BuildObserved("sha256:1", job="b", job_state="Failed", job_message="pip: no"),
        ("Failed", "False", "False", "True"),
    ),
]


@pytest.mark.parametrize(
    ("spec", "build", "expected"),
    [row[1:] for row in ENVIRONMENTS],
    ids=[row[0] for row in ENVIRONMENTS],
)
def test_environment_kstatus_conditions(
    spec: dict[str, Any], build: status.BuildObserved | None, expected: tuple[str, ...]
) -> None:
    body = environment("pytorch", "team", **spec)
    body["metadata"]["generation"] = 2
    st = status.environment_status(api.parse_environment(body), None, T0, build)
    found = {c["type"]: c for c in st["conditions"]}
    got = (st["phase"], *(found[t]["status"] for t in ("Ready", "Reconciling", "Stalled")))
    assert got == expected
    assert st["observedGeneration"] == 2
    assert found["Stalled"]["reason"] == found["Ready"]["reason"]


def test_an_invalid_environment_is_stalled() -> None:
    st = status.invalid_environment_status(1, "bad spec", None, T0)
    found = {c["type"]: (c["status"], c["reason"]) for c in st["conditions"]}
    assert found["Stalled"] == ("True", "InvalidSpec")
    assert found["Reconciling"] == ("False", "InvalidSpec")


def test_a_model_version_is_available_when_recorded() -> None:
    st = status.modelversion_status(2, "42.0 KiB", "2026-01-01T11:59:00Z", 1, T0)
    assert st["createdTime"] == "2026-01-01T11:59:00Z"
    [available] = st["conditions"]
    assert (available["type"], available["status"], available["reason"]) == (
        "Available",
        "True",
        "Published",
    )
    assert available["message"].startswith("2 file(s), 42.0 KiB")
    assert available["observedGeneration"] == 1
    assert available["lastTransitionTime"] == "2026-01-01T12:00:00Z"


EVENTS: list[tuple[str, dict[str, Any] | None, dict[str, Any], tuple[str, str, str] | None]] = [
    (
        "a new run",
        None,
        {"phase": "Pending", "conditions": [status.condition("Ready", False, "Creating", "0/2")]},
        ("Normal", "Pending", "0/2"),
    ),
    (
        "running",
        {"phase": "Queued"},
        {"phase": "Running", "conditions": [status.condition("Ready", False, "A", "2/2 up")]},
        ("Normal", "Running", "2/2 up"),
    ),
    (
        "no change",
        {"phase": "Running"},
        {"phase": "Running", "conditions": [status.condition("Ready", False, "A", "2/2 up")]},
        None,
    ),
    (
        "a failure names its reason",
        {"phase": "Running"},
        {"phase": "Failed", "conditions": [status.condition("Ready", False, "OOMKilled", "rank")]},
        ("Warning", "OOMKilled", "rank"),
    ),
    (
        "succeeded",
        {"phase": "Finalizing"},
        {"phase": "Succeeded", "conditions": [status.condition("Ready", True, "Done", "all 2")]},
        ("Normal", "Succeeded", "all 2"),
    ),
]


@pytest.mark.parametrize(
    ("previous", "new", "expected"), [r[1:] for r in EVENTS], ids=[r[0] for r in EVENTS]
)
def test_phase_changes_make_events(
    previous: dict[str, Any] | None, new: dict[str, Any], expected: tuple[str, str, str] | None
) -> None:
    assert status.phase_event(previous, new) == expected


def test_the_events_of_a_run_from_creation_to_failure() -> None:
    """Each computed status in turn: one Event per phase, the failure a Warning."""
    steps = [
        compute([], env=None),
        compute([], env={"status": {"phase": "Ready"}}),
        TABLE_STATUS["all running"],
        TABLE_STATUS["one rank failed"],
    ]
    previous: dict[str, Any] | None = None
    events = []
    for st in steps:
        event = status.phase_event(previous, st)
        if event is not None:
            events.append(event[:2])
        previous = st
    assert events == [
        ("Normal", "Preparing"),
        ("Normal", "Pending"),
        ("Normal", "Running"),
        ("Warning", "Error"),
    ]


TABLE_STATUS = {row[0]: compute(**row[1]) for row in TABLE}


READY_REASONS = [
    ("in the registry, no Job", status.BuildObserved("sha256:1", image="r/e@sha256:2"), "Cached",
     "image found in the registry"),
    ("its Job complete", status.BuildObserved("sha256:1", image="r/e@sha256:2", job="b",
     job_state="Complete"), "Built", "image built by Job b"),
    # the builder pushed and has yet to exit: Ready now, and it was built, not found
    ("its Job still ending", status.BuildObserved("sha256:1", image="r/e@sha256:2", job="b",
     job_state="Running"), "Built", "image built by Job b (the Job is ending)"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("build", "reason", "message"),
    [row[1:] for row in READY_REASONS],
    ids=[row[0] for row in READY_REASONS],
)
def test_an_image_in_the_registry_is_ready_and_says_who_made_it(
    build: status.BuildObserved, reason: str, message: str
) -> None:
    body = environment("pytorch", "team", **BUILD)
    st = status.environment_status(api.parse_environment(body), None, T0, build)
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert (st["phase"], ready["status"], ready["reason"], ready["message"]) == (
        "Ready", "True", reason, message,
    )  # fmt: skip
    assert st["image"] == "r/e@sha256:2"
