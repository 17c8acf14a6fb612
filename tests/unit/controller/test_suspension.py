"""``spec.suspend`` and Kueue's stop through ``trainingruns.reconcile``, against the
in-memory fake of ``torchyard.k8s``: the gang is deleted with its own grace period (its
ranks save a just-in-time checkpoint in it), the attempt counts as a suspension (no limit
used), the run says Suspended, and ``spec.suspend: false`` creates the next attempt's gang.
The real-control-plane version is tests/integration/test_suspend.py."""

from __future__ import annotations

from typing import Any

from tests.unit.controller.fake_k8s import FakeK8s
from tests.unit.controller.world import (
    T0,
    env,
    gpu_node,
    node_pod,
    reconcile,
    run,
    running,
    status,
    world,
)
from torchyard import api, k8s
from torchyard.controller import failure_policy, suspension
from torchyard.controller.failure_policy import Attempts
from torchyard.status import suspensions

NODES = [gpu_node("gpu-0"), gpu_node("gpu-1")]
RUNNING = {"phase": "Running", "startTime": "2026-01-01T11:59:00Z", "restarts": 0}
CHECKPOINTS = {"checkpoints": {"size": "1Gi"}, "policy.terminationGracePeriodSeconds": 90}


def graceful_deletes(fake: FakeK8s) -> list[tuple[str, int | None]]:
    """Record every Pod deletion with the grace period it asked for."""
    seen: list[tuple[str, int | None]] = []
    delete = fake.delete

    def recording(res: k8s.Resource, namespace: str | None, name: str, **kw: Any) -> bool:
        if res.plural == "pods":
            seen.append((name, kw.get("grace_period_seconds")))
        return delete(res, namespace, name, **kw)

    fake.delete = recording  # type: ignore[method-assign]
    return seen


def suspended_run(status_: dict[str, Any], suspend: bool = True) -> dict[str, Any]:
    return run(status=status_, spec={"suspend": suspend, **CHECKPOINTS})


def test_suspend_deletes_the_gang_with_its_own_grace_period_and_counts_a_suspension() -> None:
    fake = world(suspended_run(RUNNING), env(), *NODES, *running())
    deletes = graceful_deletes(fake)
    result = reconcile(fake)
    assert sorted(deletes) == [("r-0", None), ("r-1", None)]  # the Pods' own 90 s
    after = status(fake)
    assert after["phase"] == "Suspended"
    assert (after["restarts"], after["suspensions"], after.get("failedAttempts")) == (1, 1, None)
    cond = {c["type"]: c for c in after["conditions"]}
    assert cond["Suspended"]["status"] == "True"
    assert cond["Suspended"]["reason"] == "Suspending"
    assert (
        "2 node Pod(s) stopping after saving a just-in-time checkpoint"
        in (cond["Suspended"]["message"])
    )
    assert "90s" in cond["Suspended"]["message"]
    assert (cond["Admitted"]["status"], cond["Running"]["status"]) == ("False", "False")
    assert [reason for _, reason, _ in fake.events] == ["Suspended"]
    assert result.requeue_after is not None
    assert not [m for m in fake.applied if m["kind"] == "Pod"]  # nothing created


def test_a_suspended_run_whose_pods_are_gone_holds_nothing_and_waits() -> None:
    before = {**RUNNING, "phase": "Suspended", "restarts": 1, "suspensions": 1}
    fake = world(suspended_run(before), env(), *NODES)
    result = reconcile(fake)
    after = status(fake)
    assert after["phase"] == "Suspended"
    assert (after["restarts"], after["suspensions"]) == (1, 1)  # no second suspension
    cond = {c["type"]: c for c in after["conditions"]}
    assert cond["Suspended"]["reason"] == "Suspended"
    assert "torchyard resume r" in cond["Suspended"]["message"]
    assert result.requeue_after is None
    assert not fake.deleted and not [m for m in fake.applied if m["kind"] == "Pod"]


def test_resume_creates_the_next_attempts_gang_and_keeps_the_count() -> None:
    before = {**RUNNING, "phase": "Suspended", "restarts": 1, "suspensions": 1}
    fake = world(suspended_run(before, suspend=False), env(), *NODES)
    reconcile(fake)
    created = [m for m in fake.applied if m["kind"] == "Pod"]
    assert sorted(m["metadata"]["name"] for m in created) == ["r-0", "r-1"]
    assert {m["metadata"]["labels"]["torchyard.dev/attempt"] for m in created} == {"1"}
    after = status(fake)
    assert after["phase"] == "Queued"
    assert after["suspensions"] == 1
    assert "Suspended" not in {c["type"] for c in after["conditions"]}


def test_a_finalizing_run_is_not_suspended() -> None:
    run_ = api.parse_trainingrun(suspended_run({"phase": "Finalizing"}))
    assert not suspension.to_suspend(run_, "Finalizing")
    assert suspension.to_suspend(run_, "Running")


def test_suspensions_use_no_restart_limit() -> None:
    after = Attempts(restarts=3, failed_attempts=1, suspensions=0).suspended()
    assert (after.restarts, after.failed_attempts, after.suspensions) == (4, 1, 1)
    assert after.platform_restarts == 2  # the suspension is not a platform restart


def kueue_stopped_pod(node: int) -> dict[str, Any]:
    pod = node_pod(node, phase="Running", node_name=f"gpu-{node}")
    pod["status"]["conditions"] = [
        {
            "type": "TerminationTarget",
            "status": "True",
            "reason": "StoppedByKueue",
            "message": "The workload is deactivated",
        }
    ]
    return pod


def test_kueue_stopping_the_gang_restarts_it_as_a_suspension_with_the_pods_grace() -> None:
    body = run(status=RUNNING, spec={"scheduling.queueName": "team-a", **CHECKPOINTS})
    fake = world(
        body, env(), *NODES, kueue_stopped_pod(0), node_pod(1, phase="Running", node_name="gpu-1")
    )
    deletes = graceful_deletes(fake)
    reconcile(fake)
    assert sorted(deletes) == [("r-0", None), ("r-1", None)]
    after = status(fake)
    assert (after["restarts"], after["suspensions"], after.get("failedAttempts")) == (1, 1, None)
    assert "failure" not in after
    assert any("Kueue stopped node Pod r-0" in m for _, _, m in fake.events)


def test_kueue_stopped_is_read_from_the_pod_condition_only() -> None:
    plain = node_pod(0, phase="Running")
    assert suspensions.kueue_stopped([plain]) is None
    other = kueue_stopped_pod(0)
    other["status"]["conditions"][0]["reason"] = "EvictionByEvictionAPI"
    assert suspensions.kueue_stopped([other]) is None
    assert suspensions.kueue_stopped([kueue_stopped_pod(1)]) == (
        "Kueue stopped node Pod r-1: The workload is deactivated"
    )
    verdict = failure_policy.decide(
        api.parse_trainingrun(run(status=RUNNING)),
        [kueue_stopped_pod(0)],
        Attempts(restarts=20),  # the platform budget is used up: a suspension needs none
        "Running",
        None,
        T0,
    )
    assert verdict.restart is not None and verdict.restart.kind == "suspension"


def test_kueue_v0_17_stop_reasons_are_kueue_stops_too() -> None:
    """Kueue v0.17 writes its stop reason on TerminationTarget, the eviction's reason
    appended (``WorkloadEvictedDueToPreempted`` when it preempts the gang), not
    ``StoppedByKueue``: seen with the real Kueue in tests/integration/test_kueue.py."""
    preempted = kueue_stopped_pod(0)
    preempted["status"]["conditions"][0].update(
        reason="WorkloadEvictedDueToPreempted",
        message="Preempted to accommodate a workload (UID: u, JobUID: j) due to "
        "prioritization in the ClusterQueue",
    )
    assert suspensions.kueue_stopped([preempted]) == (
        "Kueue stopped node Pod r-0: Preempted to accommodate a workload (UID: u, JobUID: j) "
        "due to prioritization in the ClusterQueue"
    )
    verdict = failure_policy.decide(
        api.parse_trainingrun(run(status=RUNNING)),
        [preempted],
        Attempts(restarts=20),
        "Running",
        None,
        T0,
    )
    assert verdict.restart is not None and verdict.restart.kind == "suspension"
