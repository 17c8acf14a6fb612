"""``policy.activeDeadlineSeconds`` counts time running, suspensions left out, across
attempts (``status.deadlines``), followed through the real status functions on a
synthetic clock: a run that ran 40 s, was suspended for 16 minutes and runs again has
been running 40 s, not 17 minutes, and its next node Pods get what is left."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder, pod
from torchyard import api, status
from torchyard.status import deadlines, suspensions
from torchyard.status.trainingruns import Observed

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
ENV = {"status": {"phase": "Ready", "image": "img"}}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def the_run(deadline: int | None = 100, suspend: bool = False) -> api.TrainingRun:
    builder = TrainingRunBuilder("r").nodes(2).procs(1).with_("spec.suspend", suspend)
    if deadline is not None:
        builder = builder.with_("spec.policy.activeDeadlineSeconds", deadline)
    body = builder.obj()
    body["metadata"]["generation"] = 1
    return api.parse_trainingrun(body)


def observed(phase: str, attempt: int = 0) -> Observed:
    nodes = [pod("r", i, phase=phase, node_name=f"n{i}", attempt=attempt) for i in range(2)]
    return Observed(environment=ENV, pods=nodes, restarts=attempt)


def running(previous: dict[str, Any], seconds: float, attempt: int = 0) -> dict[str, Any]:
    return status.trainingrun_status(the_run(), observed("Running", attempt), previous, at(seconds))


def suspended(previous: dict[str, Any], seconds: float, times: int = 1) -> dict[str, Any]:
    return suspensions.suspended_status(
        the_run(suspend=True), previous, times, times, 2, at(seconds)
    )


def test_suspended_time_is_left_out_of_the_deadline_across_suspensions() -> None:
    first = running({}, 0)
    assert first["phase"] == "Running" and first["startTime"] == "2026-01-01T12:00:00Z"
    assert deadlines.active_seconds(first, at(40)) == 40

    paused = suspended(first, 40)
    assert paused["suspendedSince"] == "2026-01-01T12:00:40Z"
    # The clock stands still while suspended, and while queued again after the resume.
    assert deadlines.active_seconds(paused, at(1000)) == 40
    queued = status.trainingrun_status(
        the_run(), Observed(environment=ENV, pods=[], restarts=1), paused, at(1000)
    )
    assert queued["phase"] == "Pending" and queued["suspendedSince"] == paused["suspendedSince"]
    assert deadlines.active_seconds(queued, at(1005)) == 40

    again = running(queued, 1010, attempt=1)
    assert again["suspendedSeconds"] == 970 and "suspendedSince" not in again
    assert deadlines.active_seconds(again, at(1030)) == 60
    assert deadlines.counted_from(again, at(1030)) == at(970)

    # A second suspension adds to the first.
    twice = running(suspended(running(again, 1030, 1), 1030, times=2), 1100, attempt=2)
    assert twice["suspendedSeconds"] == 970 + 70
    assert deadlines.active_seconds(twice, at(1110)) == 70
    # A status computed later while running keeps the total.
    assert running(twice, 1200, attempt=2)["suspendedSeconds"] == 1040


def test_a_run_suspended_before_it_ever_ran_has_no_suspended_interval() -> None:
    queued = status.trainingrun_status(
        the_run(), Observed(environment=ENV, pods=[], restarts=0), {}, at(0)
    )
    paused = suspended(queued, 5)
    assert "suspendedSince" not in paused and "startTime" not in paused
    assert deadlines.active_seconds(paused, at(50)) is None


@pytest.mark.parametrize(
    ("deadline", "previous", "seconds", "expected"),
    [
        ("no deadline", {"startTime": "2026-01-01T12:00:00Z"}, 10, None),
        ("before the run first ran: all of it", {}, 10, 100),
        ("ran 30.6 s: 69 left, rounded down", {"startTime": "2026-01-01T12:00:00Z"}, 30.6, 69),
        (
            "ran 40 s, suspended since: 60 left",
            {"startTime": "2026-01-01T12:00:00Z", "suspendedSince": "2026-01-01T12:00:40Z"},
            3600,
            60,
        ),
        (
            "suspended 500 s before: 50 left",
            {"startTime": "2026-01-01T12:00:00Z", "suspendedSeconds": 500},
            550,
            50,
        ),
        ("over: at least 1", {"startTime": "2026-01-01T12:00:00Z"}, 500, 1),
    ],
)
def test_the_node_pods_get_what_is_left(
    deadline: str, previous: dict[str, Any], seconds: float, expected: int | None
) -> None:
    run_ = the_run(None if deadline == "no deadline" else 100)
    assert deadlines.pod_seconds(run_, previous, at(seconds)) == expected
