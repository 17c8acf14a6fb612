"""The failure policy with failure classes: a class that retrying cannot fix (a missing
module, out of memory) fails the run at once, a ``cancelRetries`` log rule too, and the
same error at the same step as the attempt before stops the retries, so a deterministic
error costs at most two attempts whatever ``backoffLimit`` says."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from tests.builders import TrainingRunBuilder, pod
from torchyard import api, status
from torchyard.controller import failure_policy
from torchyard.controller.failure_policy import Attempts

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
KEY_ERROR = "Traceback (most recent call last):\n  File \"train.py\"\nKeyError: 'label'"
IMPORT = "Traceback (most recent call last):\nModuleNotFoundError: No module named 'timm'"


def run(backoff: int = 3) -> api.TrainingRun:
    body = TrainingRunBuilder("r").nodes(1).with_("spec.policy", {"backoffLimit": backoff}).obj()
    return api.parse_trainingrun(body)


def failed(message: str, step: int | None, attempt: int = 0, **extra: Any) -> dict[str, Any]:
    info = {"rank": 0, "nodeRank": 0, "exitCode": 1, "reason": "Error", "message": message}
    if step is not None:
        info["step"] = step
    info.update(extra)
    return pod("r", 0, phase="Failed", exit_code=1, message=json.dumps(info), attempt=attempt)


def decide(pods: list[dict[str, Any]], previous: dict[str, Any]) -> failure_policy.Verdict:
    attempts = Attempts.of(previous)
    return failure_policy.decide(run(), pods, attempts, "Running", T0, T0)


def test_an_error_retrying_cannot_fix_fails_the_run_at_once() -> None:
    verdict = decide([failed(IMPORT, step=None)], {"restarts": 0})
    assert verdict.restart is None and verdict.failure is not None
    assert verdict.failure["failureClass"] == "ImportError"
    assert verdict.failure["retryable"] is False


def test_the_same_error_at_the_same_step_stops_after_two_attempts() -> None:
    previous: dict[str, Any] = {"phase": "Running", "restarts": 0}
    first = decide([failed(KEY_ERROR, step=40)], previous)
    assert first.restart is not None and first.restart.kind == "user"
    # what the controller writes when it restarts: status.lastFailure
    assert first.restart.failure is not None
    restarted = status.restarting_status(
        previous,
        1,
        first.restart.attempts.restarts,
        first.restart.attempts.failed_attempts,
        first.restart.message,
        T0,
        first.restart.failure,
    )
    assert restarted["lastFailure"]["class"] == "PythonException"
    assert restarted["lastFailure"]["step"] == 40
    # attempt 1 fails with the same error at the same step: no third attempt
    again = decide([failed(KEY_ERROR, step=40, attempt=1)], restarted)
    assert again.restart is None and again.failure is not None
    assert again.failure["advice"].startswith("the same error at the same step")
    # the same error further on is progress: retried
    further = decide([failed(KEY_ERROR, step=90, attempt=1)], restarted)
    assert further.restart is not None


def test_a_cancel_retries_log_rule_fails_the_run_at_once() -> None:
    hit = {"index": 0, "pattern": "label", "action": "cancelRetries", "line": "no label"}
    verdict = decide([failed(KEY_ERROR, step=1, logRule=hit)], {"restarts": 0})
    assert verdict.restart is None and verdict.failure is not None
    assert verdict.failure["retryable"] is False
