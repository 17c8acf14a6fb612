"""The failure policy of ``controller.reconcile``: which failures restart the gang, and
what the status says when none is left. Pure functions, tested as a table."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import TrainingRunBuilder
from torchyard import api
from torchyard.controller import reconcile

PLATFORM = {"reason": "NodeLost", "platform": True, "message": "node Pod r-1 disappeared"}
USER = {"reason": "Error", "platform": False, "message": "ValueError"}
ARCHIVE = {"reason": "ArchiveFailed", "platform": False, "message": "HTTP 403"}
STUCK = {"reason": "ImagePullBackOff", "platform": False, "message": "not found"}


def run(**policy: int) -> api.TrainingRun:
    return api.parse_trainingrun(TrainingRunBuilder("r").with_("spec.policy", policy).obj())


DECISIONS: list[tuple[str, api.TrainingRun, dict[str, Any], dict[str, int], str | None]] = [
    ("platform, default budget", run(), PLATFORM, {"restarts": 19}, "platform"),
    ("platform, default budget used", run(), PLATFORM, {"restarts": 20}, None),
    ("platform, budget 0", run(platformRestartLimit=0), PLATFORM, {}, None),
    (
        "user restarts do not use the platform budget",
        run(platformRestartLimit=1, backoffLimit=5),
        PLATFORM,
        {"restarts": 3, "failedAttempts": 3},
        "platform",
    ),
    ("user, backoff left", run(backoffLimit=1), USER, {}, "user"),
    ("user, backoff used", run(backoffLimit=1), USER, {"restarts": 1, "failedAttempts": 1}, None),
    ("a failed archive is not retrained", run(backoffLimit=3), ARCHIVE, {}, None),
    ("a stuck Pod is not restarted", run(backoffLimit=3), STUCK, {}, None),
]


@pytest.mark.parametrize(
    ("case", "the_run", "failure", "previous", "decision"),
    DECISIONS,
    ids=[d[0] for d in DECISIONS],
)
def test_restart_decisions(
    case: str,
    the_run: api.TrainingRun,
    failure: dict[str, Any],
    previous: dict[str, int],
    decision: str | None,
) -> None:
    assert reconcile._restart_decision(the_run, failure, previous) == decision


def test_a_final_platform_failure_says_no_restart_was_left() -> None:
    final = reconcile._final(run(platformRestartLimit=2), dict(PLATFORM), {"restarts": 2})
    assert final["reason"] == "NodeLost"
    assert final["message"] == (
        "node Pod r-1 disappeared; no platform restart left "
        "(2 of policy.platformRestartLimit 2 used)"
    )
    assert reconcile._final(run(), dict(USER), {}) == USER


@pytest.mark.parametrize(
    ("message", "missing"),
    [
        (
            'pods "r-0" is forbidden: error looking up service account t/trainer: '
            'serviceaccount "trainer" not found',
            True,
        ),
        ('pods "r-0" is forbidden: violates PodSecurity "restricted:latest"', False),
        ('pods "r-0" is forbidden: exceeded quota: compute', False),
    ],
)
def test_a_missing_service_account_is_told_apart(message: str, missing: bool) -> None:
    assert reconcile._no_service_account(message) is missing


def test_a_missing_service_account_says_what_to_do() -> None:
    body = TrainingRunBuilder("r", "team").with_("spec.serviceAccountName", "trainer").obj()
    reason, message = reconcile._service_account_missing(api.parse_trainingrun(body))
    assert reason == "ServiceAccountNotFound"
    assert "kubectl create serviceaccount trainer -n team" in message
