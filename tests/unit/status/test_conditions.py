"""Conditions keep their transition time while their status holds, so a recomputed
status is identical and is not patched again."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from torchyard import status

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


def test_transition_time_is_kept_while_status_holds() -> None:
    first = status.merge([], [status.condition("Ready", True, "Up")], T0)
    again = status.merge(first, [status.condition("Ready", True, "StillUp")], T0 + timedelta(1))
    assert again[0]["lastTransitionTime"] == "2026-01-01T12:00:00Z"
    assert again[0]["reason"] == "StillUp"


def test_transition_time_moves_when_status_flips() -> None:
    first = status.merge([], [status.condition("Ready", True, "Up")], T0)
    flipped = status.merge(
        first, [status.condition("Ready", False, "Down")], T0 + timedelta(minutes=5)
    )
    assert flipped[0]["lastTransitionTime"] == "2026-01-01T12:05:00Z"


def test_invalid_run_fails_with_the_message() -> None:
    st = status.invalid_trainingrun_status(2, "spec.x: bad", None, T0)
    assert st["phase"] == "Failed"
    assert st["failure"] == {"reason": "InvalidSpec", "message": "spec.x: bad"}
    assert status.find(st["conditions"], "Accepted")["status"] == "False"
