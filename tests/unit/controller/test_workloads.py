"""A queued run through its Kueue Workload, reconciled against the in-memory fake: the
Workload made, the gang created only once Kueue admitted it (each Pod placed as the
admission says), an eviction followed (the gang stopped, then the admission cleared),
the quota released when the run ends or is suspended, and the manager's side of
MultiKueue. The real Kueue: tests/integration/test_kueue.py and test_multikueue.py."""

from __future__ import annotations

import copy
from typing import Any

from tests.unit.controller.fake_k8s import FakeK8s
from tests.unit.controller.world import (
    NS,
    UID,
    env,
    gpu_node,
    kueue,
    kueue_crd,
    node_pod,
    priority_class,
    reconcile,
    run,
    running,
    status,
    world,
)
from torchyard import k8s
from torchyard.planning import pods

WL = "trainingrun-r-uidr"
WORKLOADS_CRD = kueue_crd(k8s.WORKLOADS_CRD)
QUEUED = {"phase": "Queued", "restarts": 0}
NODES = [gpu_node("gpu-0"), gpu_node("gpu-1")]


def queued_run(**spec: Any) -> dict[str, Any]:
    return run(status=dict(QUEUED), spec={"scheduling.queueName": "team", **spec})


def with_kueue(body: dict[str, Any], *objects: dict[str, Any]) -> FakeK8s:
    fake = world(body, env(), *NODES, *kueue("team"), WORKLOADS_CRD, *objects)
    fake.put(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "gpu"},
            "spec": {"nodeLabels": {"cloud/instance": "a3"}},
        },
        k8s.RESOURCEFLAVORS,
    )
    return fake


def workload(fake: FakeK8s) -> dict[str, Any]:
    return fake.get(k8s.WORKLOADS, NS, WL)


def made(fake: FakeK8s, wl_status: dict[str, Any], active: bool = True) -> None:
    """The run's Workload, as torchyard made it earlier, with Kueue's ``wl_status``."""
    fake.create(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {"name": WL, "namespace": NS},
            "spec": {"queueName": "team", "podSets": [], "active": active},
        }
    )
    set_status(fake, wl_status)


def set_status(fake: FakeK8s, wl_status: dict[str, Any]) -> None:
    wl = workload(fake)
    wl["status"] = wl_status
    wl["metadata"]["resourceVersion"] = "7"
    fake.put(wl)


ADMITTED = {
    "conditions": [
        {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
        {"type": "Admitted", "status": "True", "reason": "Admitted"},
    ],
    "admission": {
        "clusterQueue": "cq",
        "podSetAssignments": [
            {"name": "node-0", "flavors": {"nvidia.com/gpu": "gpu"}},
            {"name": "nodes", "flavors": {"nvidia.com/gpu": "gpu"}},
        ],
    },
}
EVICTED = {
    **ADMITTED,
    "conditions": [
        *ADMITTED["conditions"],
        {
            "type": "Evicted",
            "status": "True",
            "reason": "Preempted",
            "message": "Preempted to accommodate a workload (UID: u2) due to prioritization",
        },
    ],
}


def test_a_queued_run_gets_its_workload_and_no_pods_until_kueue_admits_it() -> None:
    fake = with_kueue(
        queued_run(**{"compute.priorityClassName": "urgent"}), priority_class("urgent", 500)
    )
    reconcile(fake)
    wl = workload(fake)
    assert wl["spec"]["queueName"] == "team"
    assert wl["spec"]["priority"] == 500
    assert wl["metadata"]["ownerReferences"][0]["uid"] == UID
    assert fake.pods() == []
    st = status(fake)
    admitted = next(c for c in st["conditions"] if c["type"] == "Admitted")
    assert (st["phase"], admitted["reason"]) == ("Queued", "Queued")
    assert admitted["message"] == f"waiting in Kueue's LocalQueue team (Workload {WL})"

    # Kueue says why it waits: its words are the run's
    set_status(
        fake,
        {
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "False",
                    "reason": "Pending",
                    "message": "couldn't assign flavors to pod set nodes: insufficient quota",
                }
            ]
        },
    )
    reconcile(fake, at=1)
    admitted = next(c for c in status(fake)["conditions"] if c["type"] == "Admitted")
    assert admitted["message"].endswith(
        "couldn't assign flavors to pod set nodes: insufficient quota"
    )
    assert fake.pods() == []


def test_an_admitted_workload_gets_its_pods_placed_as_the_admission_says() -> None:
    fake = with_kueue(queued_run())
    reconcile(fake)
    set_status(fake, copy.deepcopy(ADMITTED))
    fake.reset_writes()
    reconcile(fake, at=1)
    assert sorted(fake.posted) == ["r-0", "r-1"]  # created by POST, not applied gated
    for p in fake.pods():
        assert "schedulingGates" not in p["spec"]
        assert p["spec"]["nodeSelector"] == {pods.POOL_LABEL: "a100", "cloud/instance": "a3"}
        assert p["metadata"]["annotations"]["kueue.x-k8s.io/workload"] == WL
        assert "kueue.x-k8s.io/queue-name" not in p["metadata"]["labels"]  # no Pod group
    admitted = next(c for c in status(fake)["conditions"] if c["type"] == "Admitted")
    assert admitted["status"] == "True"


def test_an_evicted_running_gang_stops_as_a_suspension_then_its_admission_is_cleared() -> None:
    body = run(
        status={"phase": "Running", "startTime": "2026-01-01T11:59:00Z", "restarts": 0},
        spec={"scheduling.queueName": "team"},
    )
    fake = with_kueue(body, *running())
    made(fake, copy.deepcopy(EVICTED))
    fake.reset_writes()
    reconcile(fake, at=1)
    st = status(fake)
    assert (st["restarts"], st["suspensions"]) == (1, 1)
    assert "failure" not in st
    assert sorted(name for kind, name in fake.deleted if kind == "pods") == ["r-0", "r-1"]
    assert any(
        reason == "Restarting" and "Kueue evicted the run's Workload (Preempted: " in message
        for _, reason, message in fake.events
    )
    assert fake.patched == []  # its Pods are still stopping: the quota is still held

    # The Pods gone: the admission is cleared (Kueue queues the Workload again)
    fake.reset_writes()
    reconcile(fake, at=3)
    ((plural, name, patch),) = fake.patched
    assert (plural, name) == ("workloads", WL)
    assert patch["status"]["admission"] is None
    assert patch["metadata"]["resourceVersion"] == "7"
    assert fake.pods() == []
    assert status(fake)["phase"] in ("Queued", "Pending")


def test_a_run_that_ends_finishes_its_workload() -> None:
    body = run(
        status={"phase": "Running", "startTime": "2026-01-01T11:59:00Z", "restarts": 0},
        spec={"scheduling.queueName": "team"},
    )
    done = [node_pod(i, phase="Succeeded", node_name=f"gpu-{i}", exit_code=0) for i in range(2)]
    fake = with_kueue(body, *done)
    made(fake, copy.deepcopy(ADMITTED))
    result = reconcile(fake)
    assert status(fake)["phase"] == "Succeeded"
    # Not before its status says so (MultiKueue copies the status, then finishes): next
    assert [s for s in fake.statuses if s["kind"] == "Workload"] == []
    assert result.requeue_after == 0.0
    reconcile(fake, at=1)
    finished = [s for s in fake.statuses if s["kind"] == "Workload"]
    (cond,) = finished[-1]["status"]["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("Finished", "True", "Succeeded")


def test_a_suspended_run_deactivates_its_workload_and_frees_its_quota_once_stopped() -> None:
    body = run(
        status={"phase": "Running", "startTime": "2026-01-01T11:59:00Z", "restarts": 0},
        spec={"scheduling.queueName": "team", "suspend": True},
    )
    fake = with_kueue(body, *running())
    made(fake, copy.deepcopy(ADMITTED))
    reconcile(fake)
    assert workload(fake)["spec"]["active"] is False
    assert status(fake)["phase"] == "Suspended"
    # Kueue evicts it (deactivated); the Pods are gone: its admission is cleared
    evicted = copy.deepcopy(EVICTED)
    evicted["conditions"][-1]["reason"] = "Deactivated"
    set_status(fake, evicted)
    fake.reset_writes()
    reconcile(fake, at=5)
    ((_, name, patch),) = fake.patched
    assert name == WL and patch["status"]["admission"] is None
    requeued = next(c for c in patch["status"]["conditions"] if c["type"] == "Requeued")
    assert requeued["status"] == "False"  # deactivated: stays out of its queue

    # Resumed: the Workload is active again (Kueue queues it), no Pod until admitted
    stored = fake.get(k8s.TRAININGRUNS, NS, "r")
    stored["spec"]["suspend"] = False
    fake.put(stored)
    released = workload(fake)
    released["status"] = {"conditions": []}
    fake.put(released)
    fake.reset_writes()
    reconcile(fake, at=10)
    assert workload(fake)["spec"]["active"] is True
    assert fake.pods() == []
    assert status(fake)["phase"] == "Queued"


def test_a_workload_deactivated_by_someone_else_stays_so_and_the_run_says_why() -> None:
    fake = with_kueue(queued_run())
    made(
        fake,
        {
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "False",
                    "reason": "Inadmissible",
                    "message": "The workload is deactivated",
                }
            ]
        },
        active=False,
    )
    reconcile(fake)
    assert workload(fake)["spec"]["active"] is False
    admitted = next(c for c in status(fake)["conditions"] if c["type"] == "Admitted")
    assert admitted["message"].endswith("The workload is deactivated")


def test_the_chart_can_keep_plain_pod_groups() -> None:
    fake = with_kueue(queued_run())
    reconcile(fake, settings=pods.Settings(kueue_integration="podGroups"))
    assert fake.get_or_none(k8s.WORKLOADS, NS, WL) is None
    assert {p["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] for p in fake.pods()} == {"team"}


def test_without_workload_v1beta2_auto_means_plain_pod_groups() -> None:
    fake = world(queued_run(), env(), *NODES, *kueue("team"))
    reconcile(fake)
    assert fake.get_or_none(k8s.WORKLOADS, NS, WL) is None
    assert len(fake.pods()) == 2


def test_the_manager_of_a_multikueue_run_makes_its_workload_and_nothing_else() -> None:
    body = run(spec={"scheduling.queueName": "team", "managedBy": "kueue.x-k8s.io/multikueue"})
    fake = with_kueue(body)
    reconcile(fake)
    assert workload(fake)["spec"]["queueName"] == "team"
    assert fake.pods() == []
    st = status(fake)
    admitted = next(c for c in st["conditions"] if c["type"] == "Admitted")
    assert (st["phase"], admitted["reason"]) == ("Queued", "MultiKueue")

    # A worker took it: MultiKueue copies its status here; torchyard writes nothing
    wl = workload(fake)
    wl["status"] = {"clusterName": "worker-1"}
    fake.put(wl)
    mirrored = fake.get(k8s.TRAININGRUNS, NS, "r")
    mirrored["status"] = {"phase": "Running", "nodes": {"running": 2}}
    fake.put(mirrored)
    fake.reset_writes()
    reconcile(fake, at=1)
    assert fake.statuses == [] and fake.pods() == []
