"""``policy.activeDeadlineSeconds`` through ``trainingruns.reconcile`` (in-memory fake of
``torchyard.k8s``, synthetic clock): the time a run spends suspended (``spec.suspend`` or
Kueue stopping it) is not counted, and every attempt's node Pods get the seconds left of
the run's deadline, not the whole of it. The real-control-plane version is in
tests/integration/test_suspend.py."""

from __future__ import annotations

from typing import Any

from tests.unit.controller.test_suspension import kueue_stopped_pod
from tests.unit.controller.world import env, gpu_node, node_pod, reconcile, run, status, world

NODES = [gpu_node("gpu-0"), gpu_node("gpu-1")]
# Ran 60 s before T0 (the reconcile clock's 0) with a deadline of 90 s.
RUNNING = {"phase": "Running", "startTime": "2026-01-01T11:59:00Z", "restarts": 0}
DEADLINE = {"policy.activeDeadlineSeconds": 90, "checkpoints": {"size": "1Gi"}}


def created_deadlines(fake: Any) -> list[int | None]:
    return [m["spec"].get("activeDeadlineSeconds") for m in fake.applied if m["kind"] == "Pod"]


def test_suspending_stops_the_deadline_clock() -> None:
    fake = world(
        run(status=RUNNING, spec={"suspend": True, **DEADLINE}),
        env(),
        *NODES,
        *[node_pod(i, phase="Running", node_name=f"gpu-{i}") for i in range(2)],
    )
    reconcile(fake, at=0)
    after = status(fake)
    assert after["phase"] == "Suspended"
    assert after["suspendedSince"] == "2026-01-01T12:00:00Z"


def test_a_run_resumed_after_an_hour_is_not_past_its_deadline_and_gets_what_is_left() -> None:
    before = {
        **RUNNING,
        "phase": "Suspended",
        "restarts": 1,
        "suspensions": 1,
        "suspendedSince": "2026-01-01T12:00:00Z",
    }
    fake = world(run(status=before, spec={"suspend": False, **DEADLINE}), env(), *NODES)
    result = reconcile(fake, at=3600)  # an hour later
    after = status(fake)
    assert after["phase"] == "Queued", after.get("failure")
    assert "failure" not in after
    # 60 s of the 90 ran before the suspension: the new Pods get 30.
    assert created_deadlines(fake) == [30, 30]
    # Still suspended until the gang runs: the deadline is 30 s of running away.
    assert result.requeue_after is not None and result.requeue_after >= 30
    assert after["suspendedSince"] == "2026-01-01T12:00:00Z"


def test_the_gang_running_again_ends_the_suspension_and_the_clock_runs_on() -> None:
    before = {
        **RUNNING,
        "phase": "Queued",
        "restarts": 1,
        "suspensions": 1,
        "suspendedSince": "2026-01-01T12:00:00Z",
    }
    pods = [node_pod(i, attempt=1, phase="Running", node_name=f"gpu-{i}") for i in range(2)]
    fake = world(run(status=before, spec=DEADLINE), env(), *NODES, *pods)
    reconcile(fake, at=3600)
    after = status(fake)
    assert after["phase"] == "Running"
    assert after["suspendedSeconds"] == 3600 and "suspendedSince" not in after
    # 29 s later it has run 89 s of 90; 31 s later it is over.
    reconcile(fake, at=3629)
    assert status(fake)["phase"] == "Running"
    reconcile(fake, at=3631)
    failed = status(fake)
    assert failed["phase"] == "Failed" and failed["failure"]["reason"] == "DeadlineExceeded"


def test_a_restarted_gang_gets_the_deadline_left_not_all_of_it() -> None:
    before = {**RUNNING, "phase": "Pending", "restarts": 1, "failedAttempts": 1}
    fake = world(run(status=before, spec=DEADLINE), env(), *NODES)
    reconcile(fake, at=10)
    assert created_deadlines(fake) == [20, 20]  # ran 70 s of 90


def test_kueue_stopping_the_gang_stops_the_deadline_clock() -> None:
    body = run(status=RUNNING, spec={"scheduling.queueName": "team-a", **DEADLINE})
    fake = world(
        body, env(), *NODES, kueue_stopped_pod(0), node_pod(1, phase="Running", node_name="gpu-1")
    )
    reconcile(fake, at=5)
    after = status(fake)
    assert after["suspensions"] == 1
    assert after["suspendedSince"] == "2026-01-01T12:00:05Z"
