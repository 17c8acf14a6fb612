"""``status.tracking`` and ``TrackingReady``: a table of what the operator last did with
the MLflow server; a failing server is a Warning condition, never the run's phase."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from torchyard.status.tracking import CONDITION, with_tracking

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
URI = "http://mlflow:5000"
RUNNING = {"phase": "Running", "conditions": [{"type": "Running", "status": "True"}]}


@pytest.mark.parametrize(
    ("tracking", "ready", "reason", "says"),
    [
        ({"runId": "r1", "experimentId": "7"}, "True", "RunTracked", "MLflow run r1"),
        (
            {"error": "http://mlflow:5000 cannot be reached: refused"},
            "False",
            "TrackingServerError",
            "refused",
        ),
        (
            {
                "runId": "r1",
                "error": "http://mlflow:5000/api/2.0/mlflow/runs/update answered HTTP 403",
            },
            "False",
            "TrackingServerError",
            "HTTP 403",
        ),
        ({}, "False", "Pending", "no MLflow run"),
    ],
)
def test_tracking_ready_says_what_the_server_did(
    tracking: dict[str, Any], ready: str, reason: str, says: str
) -> None:
    new = with_tracking(RUNNING, tracking, URI, NOW)
    cond = {c["type"]: c for c in new["conditions"]}
    assert cond[CONDITION]["status"] == ready and cond[CONDITION]["reason"] == reason
    assert says in cond[CONDITION]["message"] and URI in cond[CONDITION]["message"]
    assert new["phase"] == "Running" and cond["Running"]["status"] == "True"
    assert new["tracking"] == tracking


def test_without_a_tracking_server_nothing_is_added() -> None:
    assert with_tracking(RUNNING, None, "", NOW) == RUNNING


def test_the_condition_keeps_its_transition_time_while_unchanged() -> None:
    first = with_tracking(RUNNING, {"runId": "r1"}, URI, NOW)
    later = with_tracking(
        first, {"runId": "r1", "step": 5}, URI, datetime(2026, 1, 2, tzinfo=timezone.utc)
    )
    when = [c["lastTransitionTime"] for c in later["conditions"] if c["type"] == CONDITION]
    assert when == [c["lastTransitionTime"] for c in first["conditions"] if c["type"] == CONDITION]
    assert later["tracking"] == {"runId": "r1", "step": 5}
