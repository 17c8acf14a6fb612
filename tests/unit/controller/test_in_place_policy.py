"""In-place restarts as the operator sees them: what a new gang's launchers may restart
(the budget in their Pods), the counts the launchers report (termination messages,
progress lines) folded into the failure policy and the status, and the Event each new
restart gets. The launchers' side is tested with real processes in
tests/unit/launcher/test_in_place.py."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder, pod
from tests.unit.controller.world import (
    env,
    gpu_node,
    node_pod,
    reconcile,
    running,
    status,
    world,
)
from tests.unit.controller.world import run as wrun
from torchyard import api
from torchyard.controller import failure_policy
from torchyard.controller.failure_policy import Attempts
from torchyard.launch import coordination
from torchyard.launch.contract import TORCHYARD_COORDINATOR, TORCHYARD_RESTART_BUDGET
from torchyard.planning import pods
from torchyard.status import failures
from torchyard.status import trainingruns as run_status

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)


def run(**policy: int) -> api.TrainingRun:
    body = TrainingRunBuilder("r").nodes(2).with_("spec.policy", policy).obj()
    return api.parse_trainingrun(body)


def said(restarts: int, failed: int, signature: str = "None|40|") -> dict[str, Any]:
    """What a launcher reports of the last in-place restart (``coordination.REPORTED``)."""
    return {
        "inPlace": restarts,
        "failedAttempts": failed,
        "backoffLimit": 10,
        "message": f"rank 2 (node 1) failed (signal 9): restarted in place (restart {restarts} "
        f"in place, {failed}/10 of backoffLimit used)",
        "signature": signature,
        "failure": {"rank": 2, "nodeRank": 1, "exitCode": 137, "signal": 9},
        "failureClass": None,
        "at": NOW.timestamp(),
    }


def ended_with(node: int, info: dict[str, Any], exit_code: int = 137) -> dict[str, Any]:
    return pod("r", node, phase="Failed", exit_code=exit_code, message=json.dumps(info))


def test_a_new_gang_s_pods_carry_what_backoff_limit_has_left_and_where_node_0_listens() -> None:
    r = run(backoffLimit=3)
    budget = Attempts(restarts=1, failed_attempts=2, in_place=1, last_signature="x").budget(r)
    assert budget == coordination.Budget(3, 2, 1, "x")
    env = {
        e["name"]: e["value"]
        for e in pods.pod(r, 1, image="i", restart_budget=budget)["spec"]["containers"][0]["env"]
    }
    assert env[TORCHYARD_COORDINATOR] == "r-0.r:29411"
    assert coordination.Budget.parse(env[TORCHYARD_RESTART_BUDGET]) == budget


@pytest.mark.parametrize(
    ("body", "attempts"),
    [
        (TrainingRunBuilder("r").nodes(2).obj(), Attempts()),  # backoffLimit 0: nothing
        (
            TrainingRunBuilder("r").nodes(2).with_("spec.policy", {"backoffLimit": 2}).obj(),
            Attempts(failed_attempts=2, in_place=2),  # used up
        ),
    ],
)
def test_without_a_restart_left_the_launchers_do_not_coordinate(
    body: dict[str, Any], attempts: Attempts
) -> None:
    r = api.parse_trainingrun(body)
    assert attempts.budget(r) is None
    manifest = pods.pod(r, 0, image="i", restart_budget=attempts.budget(r))
    names = {e["name"] for e in manifest["spec"]["containers"][0]["env"]}
    assert TORCHYARD_COORDINATOR not in names and TORCHYARD_RESTART_BUDGET not in names


def test_mpi_runs_restart_whole_gangs_only() -> None:
    body = (
        TrainingRunBuilder("r")
        .nodes(2)
        .with_("spec.distribution.type", "mpi")
        .with_("spec.policy", {"backoffLimit": 2})
        .obj()
    )
    r = api.parse_trainingrun(body)
    assert pods.in_place_env(r, coordination.Budget(2, 0)) == {}


def test_the_failure_policy_counts_what_the_ended_launchers_restarted_in_place() -> None:
    r = run(backoffLimit=3, platformRestartLimit=1)
    killed = {"rank": 2, "nodeRank": 1, "exitCode": 137, "signal": 9, "reason": "Error"}
    # backoffLimit used in place: node 1 ends with the failure the coordinator refused
    ended = [ended_with(1, {**killed, "inPlace": said(3, 3)}), pod("r", 0, phase="Running")]
    attempts = Attempts.of({"restarts": 0}).in_place_seen(failures.in_place_said(ended))
    assert (attempts.failed_attempts, attempts.in_place, attempts.platform_restarts) == (3, 3, 0)
    verdict = failure_policy.decide(
        r, [ended[0], pod("r", 0, phase="Failed", exit_code=143)], attempts, "Running", NOW, NOW
    )
    assert verdict.restart is None and verdict.failure is not None
    # one platform restart is still left: in-place restarts are not platform restarts
    lost = failure_policy.decide(r, [pod("r", 0, phase="Running")], attempts, "Running", NOW, NOW)
    assert lost.restart is not None and lost.restart.kind == "platform"
    assert lost.restart.attempts.in_place == 3


def test_counts_only_grow_and_the_last_restart_s_signature_is_kept() -> None:
    base = Attempts(restarts=1, failed_attempts=2, in_place=1, last_signature="gang")
    assert base.in_place_seen([]) == base
    assert base.in_place_seen([said(1, 2)]) == base  # nothing new
    seen = base.in_place_seen([said(2, 3, "x"), said(3, 4, "y")])
    assert (seen.failed_attempts, seen.in_place, seen.last_signature) == (4, 3, "y")


def test_the_status_says_how_many_restarts_in_place_and_what_failed_last() -> None:
    observed = run_status.Observed(restarts=0, failed_attempts=1, in_place=1)
    newer = run_status.with_in_place(observed, [said(1, 1), said(3, 3)])
    assert (newer.in_place, newer.failed_attempts) == (3, 3)
    assert run_status.with_in_place(newer, [said(2, 2)]) is newer  # a launcher behind
    assert newer.last_in_place is not None
    assert run_status.in_place_status(newer.last_in_place) == {
        "message": said(3, 3)["message"],
        "time": "2026-01-01T12:00:00Z",
        "rank": 2,
        "node": 1,
    }


@pytest.mark.parametrize(
    ("before", "after", "event"),
    [
        (0, 0, None),
        (2, 2, None),
        (0, 1, "rank 2 (node 1) failed"),
        (1, 4, "3 in-place restarts since the last look; the last: rank 2 (node 1) failed"),
    ],
)
def test_each_new_in_place_restart_gets_an_event(
    before: int, after: int, event: str | None
) -> None:
    new = {"inPlaceRestarts": after, "lastInPlaceRestart": {"message": "rank 2 (node 1) failed"}}
    assert run_status.in_place_event({"inPlaceRestarts": before}, new) == event


def test_a_running_gang_s_restarts_in_place_reach_the_status_and_events_once_each() -> None:
    """Through reconcile, as the operator sees a running gang: node 0's progress lines carry
    the launchers' count; a new count is an Event, the same count no second one."""
    fake = world(
        wrun(status={"phase": "Running", "startTime": "2026-01-01T11:59:00Z", "restarts": 0}),
        env(),
        gpu_node("gpu-0"),
        gpu_node("gpu-1"),
        *running(),
    )
    progress_line = {"step": 40, "inPlace": said(2, 2)}
    fake.logs = {"r-0": ["[torchyard] progress " + json.dumps(progress_line)], "r-1": []}
    reconcile(fake, at=10)
    got = status(fake)
    assert (got["phase"], got["restarts"], got["inPlaceRestarts"], got["failedAttempts"]) == (
        "Running",
        0,
        2,
        2,
    )
    assert got["lastInPlaceRestart"]["rank"] == 2
    assert got["lastFailure"] == {"rank": 2, "node": 1, "exitCode": 137, "signal": 9}
    assert "inPlace" not in got["progress"]
    restarted = [e for e in fake.events if e[1] == "RestartedInPlace"]
    assert restarted == [
        (
            "Warning",
            "RestartedInPlace",
            "2 in-place restarts since the last look; the last: " + said(2, 2)["message"],
        )
    ]
    fake.events.clear()
    reconcile(fake, at=25)
    assert not [e for e in fake.events if e[1] == "RestartedInPlace"]
    assert status(fake)["inPlaceRestarts"] == 2


def test_a_gang_restart_after_restarts_in_place_keeps_their_count() -> None:
    """A node left out (a GPU Xid) after three restarts in place: the gang restarts, and
    the status keeps the count the ended launcher said, not the last poll's."""
    xid = {
        "rank": 2,
        "nodeRank": 1,
        "exitCode": 1,
        "reason": "Error",
        "step": 50,
        "evidence": [{"line": "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus"}],
        "inPlace": said(3, 3),
    }
    fake = world(
        wrun(
            status={
                "phase": "Running",
                "startTime": "2026-01-01T11:59:00Z",
                "restarts": 0,
                "inPlaceRestarts": 1,
                "failedAttempts": 1,
            },
            spec={"policy.backoffLimit": 10},
        ),
        env(),
        gpu_node("gpu-0"),
        gpu_node("gpu-1"),
        node_pod(
            0, phase="Failed", node_name="gpu-0", exit_code=143, message='{"reason": "Terminated"}'
        ),
        node_pod(1, phase="Failed", node_name="gpu-1", exit_code=1, message=json.dumps(xid)),
    )
    reconcile(fake, at=30)
    got = status(fake)
    assert (got["restarts"], got["inPlaceRestarts"], got["failedAttempts"]) == (1, 3, 4), got
