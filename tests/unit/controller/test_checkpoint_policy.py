"""What the failure policy makes of the launcher's checkpoint verdicts: an attempt that
stopped with reason NoProgress (too many resumed attempts failed before any progress) ends
the run with that reason and its message, with backoffLimit left; a failure after which the
launcher only quarantined a checkpoint is restarted as any other failure of the code."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from tests.builders import TrainingRunBuilder, pod
from torchyard import api, checkpoint
from torchyard.controller import failure_policy
from torchyard.controller.failure_policy import Attempts
from torchyard.status import failures


def failed_pod(info: dict[str, object]) -> dict[str, object]:
    return pod("r", 0, phase="Failed", exit_code=1, message=json.dumps(info))


def test_no_progress_stops_the_run_with_backoff_left() -> None:
    run = api.parse_trainingrun(TrainingRunBuilder("r").with_("spec.policy.backoffLimit", 5).obj())
    why = "2 attempts failed before making progress from their checkpoint (...)"
    info = {"rank": 0, "exitCode": 1, "reason": checkpoint.NO_PROGRESS_REASON, "message": why}
    failure = failures.first_failure([failed_pod(info)])
    assert failure is not None and failure["reason"] == "NoProgress"
    assert failure_policy.restart_kind(run, failure, Attempts(2, 2)) is None
    assert failure_policy.final(run, failure, Attempts(2, 2))["message"] == why


def test_a_quarantine_alone_is_restarted_within_backoff() -> None:
    run = api.parse_trainingrun(TrainingRunBuilder("r").with_("spec.policy.backoffLimit", 5).obj())
    info = {"rank": 0, "exitCode": 1, "reason": "Error", "quarantined": "quarantine-step-10"}
    failure = failures.first_failure([failed_pod(info)])
    assert failure is not None
    assert failure_policy.restart_kind(run, failure, Attempts(1, 1)) == "user"


def test_a_sibling_failing_while_a_node_pod_is_being_deleted_is_the_disruption() -> None:
    """A node Pod deleted (or preempted) from a running gang saves just in time and keeps
    running a moment; its sibling's rank meanwhile fails on the lost collective. The
    restart is a platform one: backoffLimit 0 is not used up."""
    run = api.parse_trainingrun(TrainingRunBuilder("r").nodes(2).obj())
    info = {"rank": 0, "exitCode": 1, "reason": "Error", "exitedAt": 1.0e9}
    sibling = failed_pod(info)
    deleted = pod("r", 1, phase="Running")
    deleted["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    now = datetime(2026, 1, 1, 12, 0, 1, tzinfo=timezone.utc)
    verdict = failure_policy.decide(run, [sibling, deleted], Attempts(), "Running", now, now)
    assert verdict.restart is not None and verdict.restart.kind == "platform"
    after = verdict.restart.attempts
    assert (after.restarts, after.failed_attempts) == (1, 0)
    # Without the deletion the same failure is the code's, and backoffLimit 0 ends the run.
    alone = failure_policy.decide(
        run, [sibling, pod("r", 1, phase="Running")], Attempts(), "Running", now, now
    )
    assert alone.restart is None
