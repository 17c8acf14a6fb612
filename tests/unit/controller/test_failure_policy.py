"""``controller.failure_policy``: which failures restart the gang, and what the status says
when none is left. Pure functions, tested as a table."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tests.builders import TrainingRunBuilder, pod
from torchyard import api
from torchyard.controller import failure_policy, ttl_after_finished
from torchyard.controller.failure_policy import Attempts
from torchyard.status.failures import FAILURE_SETTLE_SECONDS, Failure

PLATFORM: Failure = {"reason": "NodeLost", "platform": True, "message": "node Pod r-1 disappeared"}
USER: Failure = {"reason": "Error", "platform": False, "message": "ValueError"}
ARCHIVE: Failure = {"reason": "ArchiveFailed", "platform": False, "message": "HTTP 403"}
STUCK: Failure = {"reason": "ImagePullBackOff", "platform": False, "message": "not found"}


def run(**policy: int) -> api.TrainingRun:
    return api.parse_trainingrun(TrainingRunBuilder("r").with_("spec.policy", policy).obj())


DECISIONS: list[tuple[str, api.TrainingRun, Failure, dict[str, int], str | None]] = [
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
    (
        "platform restarts do not use the backoff",
        run(backoffLimit=1),
        USER,
        {"restarts": 2, "failedAttempts": 0},
        "user",
    ),
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
    failure: Failure,
    previous: dict[str, int],
    decision: str | None,
) -> None:
    assert failure_policy.restart_kind(the_run, failure, Attempts.of(previous)) == decision


def test_a_final_platform_failure_says_no_restart_was_left() -> None:
    final = failure_policy.final(run(platformRestartLimit=2), PLATFORM, Attempts(restarts=2))
    assert final["reason"] == "NodeLost"
    assert final["message"] == (
        "node Pod r-1 disappeared; no platform restart left "
        "(2 of policy.platformRestartLimit 2 used)"
    )
    assert failure_policy.final(run(), USER, Attempts()) == USER


T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
STARTED = T0 - timedelta(minutes=1)
RUNNING = [pod("r", i, phase="Running", node_name="n") for i in range(2)]
FAILED_0 = pod("r", 0, phase="Failed", exit_code=1, finished_at="2026-01-01T11:59:30Z")


def two_nodes(**policy: int) -> api.TrainingRun:
    body = TrainingRunBuilder("r").nodes(2).with_("spec.policy", policy).obj()
    return api.parse_trainingrun(body)


VERDICTS: list[tuple[str, api.TrainingRun, list[dict[str, object]], str, str]] = [
    # case, run, Pods of the attempt, phase before, what the verdict says
    ("all running", two_nodes(), RUNNING, "Running", "nothing"),
    ("deadline ahead", two_nodes(activeDeadlineSeconds=90), RUNNING, "Running", "wait 30"),
    ("deadline over", two_nodes(activeDeadlineSeconds=60), RUNNING, "Running", "deadline"),
    (
        "deadline over wins over a failure",
        two_nodes(activeDeadlineSeconds=60),
        [FAILED_0, RUNNING[1]],
        "Running",
        "deadline",
    ),
    ("a failure, no backoff", two_nodes(), [FAILED_0, RUNNING[1]], "Running", "fail Error"),
    (
        "a failure, backoff left",
        two_nodes(backoffLimit=1),
        [FAILED_0, RUNNING[1]],
        "Running",
        "restart user",
    ),
    ("a Pod gone while Running", two_nodes(), RUNNING[:1], "Running", "restart platform"),
    ("a Pod not yet there while Queued", two_nodes(), RUNNING[:1], "Queued", "nothing"),
    (
        "a lost peer's failure may yet precede",
        two_nodes(),
        [
            pod(
                "r",
                0,
                phase="Failed",
                exit_code=1,
                message="RuntimeError: [pair.cc:598] Connection closed by peer",
                finished_at="2026-01-01T12:00:00Z",
            ),
            RUNNING[1],
        ],
        "Running",
        f"settle {FAILURE_SETTLE_SECONDS:g}",  # the whole window: it failed just now
    ),
    (
        "a failure of its own while its peer runs: at once",
        two_nodes(),
        [pod("r", 0, phase="Failed", exit_code=1, finished_at="2026-01-01T12:00:00Z"), RUNNING[1]],
        "Running",
        "fail Error",
    ),
]


def summary(verdict: failure_policy.Verdict) -> str:
    if verdict.settle_seconds is not None:
        return f"settle {verdict.settle_seconds:g}"
    if verdict.restart is not None:
        return f"restart {verdict.restart.kind}"
    if verdict.deadline_exceeded:
        return "deadline"
    if verdict.failure is not None:
        return f"fail {verdict.failure['reason']}"
    if verdict.deadline_seconds_left is not None:
        return f"wait {verdict.deadline_seconds_left:g}"
    return "nothing"


@pytest.mark.parametrize(
    ("case", "the_run", "pods", "phase", "expected"), VERDICTS, ids=[v[0] for v in VERDICTS]
)
def test_verdicts(
    case: str, the_run: api.TrainingRun, pods: list[dict[str, object]], phase: str, expected: str
) -> None:
    verdict = failure_policy.decide(the_run, pods, Attempts(), phase, STARTED, T0)
    assert summary(verdict) == expected


def test_a_restart_counts_and_says_what_it_counted() -> None:
    user = failure_policy.restart(two_nodes(backoffLimit=3), USER, "user", Attempts(2, 1))
    assert (user.attempts.restarts, user.attempts.failed_attempts) == (3, 2)
    assert user.attempts.last_signature is not None  # status.lastFailure, for next time
    assert user.message.startswith("restarting the gang (restart 3, 2/3 of backoffLimit used)")
    platform = failure_policy.restart(two_nodes(), PLATFORM, "platform", Attempts(2, 1))
    assert (platform.attempts.restarts, platform.attempts.failed_attempts) == (3, 1)
    assert "a platform failure, not counted against backoffLimit" in platform.message


@pytest.mark.parametrize(
    ("ttl", "completed", "left"),
    [
        (None, STARTED, None),  # no TTL
        (120, None, None),  # not finished yet
        (120, STARTED, 60.0),
        (60, STARTED, 0.0),
        (0, STARTED, -60.0),
    ],
)
def test_ttl_seconds_left(ttl: int | None, completed: datetime | None, left: float | None) -> None:
    body = TrainingRunBuilder("r").obj()
    if ttl is not None:
        body["spec"]["policy"] = {"ttlSecondsAfterFinished": ttl}
    assert ttl_after_finished.seconds_left(api.parse_trainingrun(body), completed, T0) == left
