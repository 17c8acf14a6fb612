"""spec.suspend on the real control plane (KWOK nodes): ``torchyard suspend`` stops the
gang, frees its capacity at once for the run queued behind it, and ``torchyard resume``
queues the run again in its order, as a new attempt that counts as a suspension."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from tests.builders import TrainingRunBuilder
from tests.cluster.harness import Cluster, Pool, node_manifest
from tests.integration.helpers import (
    conditions,
    finish_pod,
    local_queue,
    run_pods,
    stand_in_kueue,
    wait_for,
    wait_status,
)
from tests.integration.test_cli import torchyard
from tests.integration.test_trainingruns import running
from torchyard import k8s
from torchyard.k8s import rest


@pytest.fixture
def one_node_pool(cluster: Cluster) -> Iterator[Pool]:
    """One fake node of 8 GPUs of this test's own: room for one of the runs at a time."""
    pool = Pool(f"s{time.monotonic_ns() % 10**8}", nodes=1, gpus=8, cpu="16", memory="64Gi")
    k8s.create(node_manifest(pool, 0))
    wait_for(
        "the pool's node Ready",
        lambda: any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in k8s.get(k8s.NODES, None, f"{pool.name}-0")
            .get("status", {})
            .get("conditions", [])
        ),
    )
    yield pool
    k8s.delete(k8s.NODES, None, f"{pool.name}-0")


def whole_node_run(name: str, namespace: str, pool: str) -> dict[str, object]:
    return (
        TrainingRunBuilder(name, namespace)
        .environment("pytorch")
        .nodes(1)
        .procs(8)
        .gpus(8)
        .pool(pool)
        .obj()
    )


def test_a_suspended_run_frees_its_capacity_and_resumes_in_queue_order(
    cluster: Cluster, env: str, one_node_pool: Pool
) -> None:
    ns, pool = env, one_node_pool.name
    k8s.create(whole_node_run("first", ns, pool))
    running(ns, "first")
    k8s.create(whole_node_run("second", ns, pool))
    wait_status(k8s.TRAININGRUNS, ns, "second", lambda s: s.get("phase") == "Queued")

    said = torchyard(cluster, "suspend", "first", "-n", ns)
    assert said.returncode == 0, said.stderr
    assert "suspending" in said.stdout
    suspended = wait_status(
        k8s.TRAININGRUNS,
        ns,
        "first",
        lambda s: (
            s.get("phase") == "Suspended"
            and conditions({"status": s})["Suspended"]["reason"] == "Suspended"
        ),
        timeout=60,
    )
    assert suspended["status"]["suspensions"] == 1 and suspended["status"]["restarts"] == 1
    assert "failedAttempts" not in suspended["status"]
    assert run_pods(ns, "first") == []
    # Its room went to the run queued behind it while it is suspended.
    second = running(ns, "second", timeout=60)
    assert second["status"]["phase"] == "Running"

    said = torchyard(cluster, "resume", "first", "-n", ns)
    assert said.returncode == 0, said.stderr
    queued = wait_status(k8s.TRAININGRUNS, ns, "first", lambda s: s.get("phase") == "Queued")
    assert conditions(queued)["Admitted"]["reason"] == "Queued"
    pods = run_pods(ns, "first")
    assert [p["metadata"]["labels"]["torchyard.dev/attempt"] for p in pods] == ["1"]
    assert all("schedulingGates" in p["spec"] for p in pods)
    for p in run_pods(ns, "second"):
        finish_pod(cluster, ns, p["metadata"]["name"], 0)
    resumed = running(ns, "first", timeout=60)
    assert resumed["status"]["suspensions"] == 1
    assert "Suspended" not in conditions(resumed)

    wait_status(k8s.TRAININGRUNS, ns, "second", lambda s: s.get("phase") == "Succeeded")
    refused = torchyard(cluster, "suspend", "second", "-n", ns)
    assert refused.returncode == 1
    assert "is Succeeded: only a run that has not finished" in refused.stderr


def test_a_gang_kueue_stops_restarts_as_a_suspension_using_no_limit(
    cluster: Cluster, env: str
) -> None:
    """Kueue stops a plain Pod group by marking its Pods TerminationTarget (reason
    StoppedByKueue) and deleting them; done here by hand, as Kueue's pod controller does
    (no Kueue runs here, so nothing gates the new Pods; its LocalQueue CRD is a stand-in,
    as the operator waits for the queue a run names). Before this, the deleted Pod was a
    platform failure: with platformRestartLimit 0 the run failed."""
    ns = env
    with stand_in_kueue():
        local_queue(ns, "team-a")
        _kueue_stops_the_gang(ns)


def _kueue_stops_the_gang(ns: str) -> None:
    k8s.create(
        TrainingRunBuilder("kueued", ns)
        .environment("pytorch")
        .nodes(2)
        .procs(1)
        .gpus(1)
        .pool("a100")
        .with_("spec.scheduling.queueName", "team-a")
        .with_("spec.policy.platformRestartLimit", 0)  # a suspension needs no restart left
        .obj()
    )
    running(ns, "kueued", timeout=60)
    uid = k8s.get(k8s.PODS, ns, "kueued-0")["metadata"]["uid"]
    k8s.apply_status(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "kueued-0", "namespace": ns},
            "status": {
                "conditions": [
                    {
                        "type": "TerminationTarget",
                        "status": "True",
                        "reason": "StoppedByKueue",
                        "message": "The workload is deactivated",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ]
            },
        },
        field_manager="kueue",
    )
    # On a real kubelet the marked Pod stays while its grace period runs (its ranks save);
    # a KWOK Pod goes at once, so the condition is first seen here, then the Pod is
    # deleted as Kueue does (that one, not a new one of the same name the operator may
    # have made meanwhile: the operator deletes the stopped gang itself, gone is fine).
    wait_status(k8s.TRAININGRUNS, ns, "kueued", lambda s: s.get("restarts") == 1, timeout=60)
    try:
        rest.call(
            "DELETE",
            k8s.PODS.path(ns, "kueued-0"),
            body={"preconditions": {"uid": uid}},
        )
    except k8s.ApiError as err:
        assert err.status in (404, 409), err
    again = wait_status(
        k8s.TRAININGRUNS,
        ns,
        "kueued",
        lambda s: (
            s.get("restarts") == 1
            and s.get("phase") == "Running"
            and s.get("nodes", {}).get("running") == 2
        ),
        timeout=90,
    )
    assert again["status"]["suspensions"] == 1
    assert "failedAttempts" not in again["status"] and "failure" not in again["status"]
    pods = run_pods(ns, "kueued")
    assert {p["metadata"]["labels"]["torchyard.dev/attempt"] for p in pods} == {"1"}
    assert {p["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] for p in pods} == {"kueued-1"}


def _time(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def test_time_suspended_is_not_counted_in_the_deadline_and_new_pods_get_what_is_left(
    cluster: Cluster, env: str, one_node_pool: Pool
) -> None:
    """A run with activeDeadlineSeconds 20 is suspended after a few seconds for longer than
    20 s: resumed, it runs again (before, it failed at once with DeadlineExceeded), its new
    Pods' activeDeadlineSeconds is what was left, and it fails for the deadline only once
    it ran 20 s in all."""
    ns, deadline = env, 20
    body = whole_node_run("timed", ns, one_node_pool.name)
    spec = body["spec"]
    assert isinstance(spec, dict)
    spec.setdefault("policy", {})["activeDeadlineSeconds"] = deadline
    k8s.create(body)
    running(ns, "timed", timeout=60)
    assert [p["spec"]["activeDeadlineSeconds"] for p in run_pods(ns, "timed")] == [deadline]

    said = torchyard(cluster, "suspend", "timed", "-n", ns)
    assert said.returncode == 0, said.stderr
    suspended = wait_status(
        k8s.TRAININGRUNS,
        ns,
        "timed",
        lambda s: (
            s.get("phase") == "Suspended"
            and conditions({"status": s})["Suspended"]["reason"] == "Suspended"
        ),
        timeout=60,
    )["status"]
    started, since = _time(suspended["startTime"]), _time(suspended["suspendedSince"])
    ran = int((since - started).total_seconds())
    assert 0 <= ran < deadline
    # Suspended past the moment the deadline would have been over, counted from the start.
    wait_for(
        "the deadline counted from the start to be over",
        lambda: datetime.now(timezone.utc) > started + timedelta(seconds=deadline + 3),
        timeout=deadline + 10,
    )
    assert k8s.get(k8s.TRAININGRUNS, ns, "timed")["status"]["phase"] == "Suspended"

    said = torchyard(cluster, "resume", "timed", "-n", ns)
    assert said.returncode == 0, said.stderr
    resumed = running(ns, "timed", timeout=60)["status"]
    assert "failure" not in resumed
    assert "suspendedSince" not in resumed
    assert resumed["suspendedSeconds"] >= deadline + 3 - ran
    pods = run_pods(ns, "timed")
    assert [p["metadata"]["labels"]["torchyard.dev/attempt"] for p in pods] == ["1"]
    assert [p["spec"]["activeDeadlineSeconds"] for p in pods] == [deadline - ran]

    # The clock runs on from where it stood: the run fails for its deadline once it has
    # run 20 s in all (suspended time left out).
    failed = wait_status(
        k8s.TRAININGRUNS, ns, "timed", lambda s: s.get("phase") == "Failed", timeout=120
    )["status"]
    assert failed["failure"]["reason"] == "DeadlineExceeded"
    total = _time(failed["completionTime"]) - started
    active = total.total_seconds() - failed["suspendedSeconds"]
    assert deadline - 1 <= active <= deadline + 5, (active, failed)
