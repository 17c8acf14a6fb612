"""One wording of a failure: the conditions, Events, local mode, the SDK and the CLI say it
through status.failures.failure_message (the SDK's failure_text adds the Pod)."""

from __future__ import annotations

from typing import Any

import pytest

from torchyard.sdk import runs
from torchyard.status.failures import failure_message

TRACE = "Traceback (most recent call last):\nValueError: loss is NaN"


@pytest.mark.parametrize(
    ("failure", "short", "with_pod"),
    [
        (
            {"rank": 3, "node": 1, "pod": "gpt-1", "exitCode": 1, "reason": "Error"},
            "rank 3 (node 1) failed (Error, exit code 1)",
            "rank 3 (node 1, Pod gpt-1) failed (Error, exit code 1)",
        ),
        (
            {"node": 0, "pod": "gpt-0", "signal": "SIGKILL", "reason": "OOMKilled"},
            "node 0 failed (OOMKilled, signal SIGKILL)",
            "node 0 (Pod gpt-0) failed (OOMKilled, signal SIGKILL)",
        ),
        (
            {"pod": "gpt-0", "exitCode": 2},
            "the run failed (Error, exit code 2)",
            "the run (Pod gpt-0) failed (Error, exit code 2)",
        ),
        ({"reason": "InvalidSpec"}, "the run failed (InvalidSpec)", "the run failed (InvalidSpec)"),
    ],
)
def test_the_heads(failure: dict[str, Any], short: str, with_pod: str) -> None:
    assert failure_message(failure) == short
    assert failure_message(failure, pod=True) == with_pod


def test_the_traceback_is_its_last_line_or_whole() -> None:
    failure = {"rank": 0, "node": 0, "exitCode": 1, "message": TRACE + "\n"}
    assert failure_message(failure) == "rank 0 (node 0) failed (Error, exit code 1): " + (
        "ValueError: loss is NaN"
    )
    assert failure_message(failure, full=True) == (
        "rank 0 (node 0) failed (Error, exit code 1):\n" + TRACE
    )


def test_the_sdk_says_the_failure_in_the_same_words() -> None:
    failure = {"rank": 3, "node": 1, "pod": "gpt-1", "exitCode": 1, "message": TRACE}
    run = {"status": {"phase": "Failed", "failure": failure}}
    assert runs.failure_text(run) == failure_message(failure, full=True, pod=True)
    assert runs.failure_text(run).startswith(failure_message({**failure, "message": ""}, pod=True))


def test_without_a_failure_the_sdk_says_the_last_failing_condition() -> None:
    conditions = [
        {"type": "Ready", "status": "False", "message": "starting"},
        {"type": "Failed", "status": "True", "message": "spec.nodes: must be at least 1"},
    ]
    run = {"status": {"phase": "Failed", "conditions": conditions}}
    assert runs.failure_text(run) == "spec.nodes: must be at least 1"
    assert runs.failure_text({"status": {}}) == "no failure details"
