"""A TrainingRun handed to a real Kueue (``scheduling.queueName``), on KWOK GPU nodes.

Kueue's controller manager, built from its Go module (``tests/cluster/kueue.py``), runs
with its plain-Pod-group integration: a ClusterQueue with 2 GPUs of quota admits a 2-node
run (its Pod group's gates lifted by Kueue, not by torchyard); a higher-priority Pod in the
same queue makes Kueue preempt it (Kueue marks the run's Pods ``TerminationTarget`` and
deletes them): torchyard restarts the gang as a suspension (no limit used), Kueue holds
the new Pod group gated while the preemptor holds the quota, and admits it once the
preemptor is done, and the run runs again.

Part of the integration tier: a run that selects it builds Kueue before its first test
(minutes on 2 cores the first time, cached after: tests/conftest.py).

    .venv/bin/python -m pytest tests/integration/test_kueue.py
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder
from tests.cluster.harness import Cluster, Pool, node_manifest
from tests.cluster.kueue import ADMISSION_GATE, QUEUE_LABEL, Kueue
from tests.integration.helpers import finish_pod, run_pods, wait_for, wait_status
from tests.integration.test_trainingruns import running
from torchyard import k8s

KUEUE_GROUP = "kueue.x-k8s.io/pod-group-name"


@pytest.fixture(scope="module")
def kueue(cluster: Cluster) -> Iterator[Kueue]:
    started = time.monotonic()
    k = Kueue(cluster).start()
    print(f"\n[kueue] ready in {time.monotonic() - started:.1f}s")
    yield k
    k.stop()


@pytest.fixture
def pool(cluster: Cluster) -> Iterator[Pool]:
    """Two fake nodes of 2 GPUs of this test's own (room enough: Kueue's quota decides)."""
    pool = Pool(f"kq{time.monotonic_ns() % 10**8}", nodes=2, gpus=2, cpu="16", memory="64Gi")
    for i in range(pool.nodes):
        k8s.create(node_manifest(pool, i))
    yield pool
    for i in range(pool.nodes):
        k8s.delete(k8s.NODES, None, f"{pool.name}-{i}")


def _create(cluster: Cluster, path: str, body: dict[str, Any]) -> None:
    code, answer = cluster.request("POST", path, body)
    assert code in (201, 409), answer


def queue(cluster: Cluster, namespace: str, name: str) -> None:
    """A ResourceFlavor, a ClusterQueue of 2 GPUs that preempts lower priorities, and
    the LocalQueue ``name`` in ``namespace`` pointing at it."""
    api = "/apis/kueue.x-k8s.io/v1beta2"
    flavor, cq = f"{name}-flavor", f"{name}-{namespace}"[:63]
    _create(
        cluster,
        f"{api}/resourceflavors",
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
         "metadata": {"name": flavor}},
    )  # fmt: skip
    _create(
        cluster,
        f"{api}/clusterqueues",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": cq},
            "spec": {
                "namespaceSelector": {},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": flavor,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "64"},
                                    {"name": "memory", "nominalQuota": "256Gi"},
                                    {"name": "nvidia.com/gpu", "nominalQuota": "2"},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
    )
    _create(
        cluster,
        f"{api}/namespaces/{namespace}/localqueues",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": cq},
        },
    )
    _create(
        cluster,
        "/apis/scheduling.k8s.io/v1/priorityclasses",
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "kueue-test-high"},
            "value": 1000,
        },
    )


def preemptor(namespace: str, pool: str, queue_name: str) -> dict[str, Any]:
    """A plain Pod of higher priority in the same queue that wants the 2 GPUs."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "urgent", "namespace": namespace, "labels": {QUEUE_LABEL: queue_name}},
        "spec": {
            "priorityClassName": "kueue-test-high",
            "nodeSelector": {"torchyard.dev/pool": pool},
            "containers": [
                {
                    "name": "c",
                    "image": "pause",
                    "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "2"},
                                  "limits": {"nvidia.com/gpu": "2"}},
                }
            ],
        },
    }  # fmt: skip


def gates(pod: dict[str, Any]) -> list[str]:
    return [g["name"] for g in pod["spec"].get("schedulingGates") or []]


def events(namespace: str, name: str) -> list[dict[str, Any]]:
    return [
        e
        for e in k8s.list_(k8s.EVENTS, namespace)
        if e.get("involvedObject", {}).get("name") == name
    ]


def test_kueue_admits_preempts_and_readmits_a_gang_and_torchyard_counts_a_suspension(
    cluster: Cluster, kueue: Kueue, env: str, pool: Pool
) -> None:
    ns = env
    queue(cluster, ns, "team-a")
    k8s.create(
        TrainingRunBuilder("kq", ns)
        .environment("pytorch")
        .nodes(2)
        .procs(1)
        .gpus(1)
        .pool(pool.name)
        .with_("spec.scheduling.queueName", "team-a")
        .with_("spec.policy.platformRestartLimit", 0)  # a suspension needs no restart left
        .obj()
    )
    first = running(ns, "kq", timeout=120)
    pods = run_pods(ns, "kq")
    # Kueue's webhook took the Pods (its label), and Kueue, not torchyard, admitted them.
    assert {p["metadata"]["labels"].get("kueue.x-k8s.io/managed") for p in pods} == {"true"}
    assert all(not gates(p) for p in pods)
    assert {p["metadata"]["labels"][KUEUE_GROUP] for p in pods} == {"kq-0"}
    assert first["status"]["restarts"] == 0

    k8s.create(preemptor(ns, pool.name, "team-a"))
    stopped = wait_status(
        k8s.TRAININGRUNS, ns, "kq", lambda s: s.get("suspensions") == 1, timeout=120
    )["status"]
    assert stopped["restarts"] == 1
    assert "failure" not in stopped and "failedAttempts" not in stopped

    # The reconcile writes the status first, then its Events: wait for the Event.
    def said_so() -> list[str] | None:
        said = [e["message"] for e in events(ns, "kq") if e.get("reason") == "Restarting"]
        found = [m for m in said if "as a suspension" in m and "Kueue stopped node Pod" in m]
        return found or None

    wait_for("the Restarting Event that says it is a suspension", said_so, timeout=60)

    # The next attempt's Pod group waits, gated by Kueue, while the preemptor runs.
    def next_group_gated() -> list[dict[str, Any]] | None:
        now = run_pods(ns, "kq")
        attempt = [p for p in now if p["metadata"]["labels"][KUEUE_GROUP] == "kq-1"]
        if len(attempt) == 2 and all(ADMISSION_GATE in gates(p) for p in attempt):
            return attempt
        return None

    wait_for("the next attempt's Pods gated by Kueue", next_group_gated, timeout=120)
    wait_status(k8s.PODS, ns, "urgent", lambda s: s.get("phase") == "Running", timeout=120)
    assert k8s.get(k8s.TRAININGRUNS, ns, "kq")["status"]["phase"] != "Running"

    finish_pod(cluster, ns, "urgent", 0)
    again = wait_status(
        k8s.TRAININGRUNS,
        ns,
        "kq",
        lambda s: s.get("phase") == "Running" and s.get("nodes", {}).get("running") == 2,
        timeout=180,
    )["status"]
    assert (again["restarts"], again["suspensions"]) == (1, 1)
    assert "failure" not in again
    resumed = run_pods(ns, "kq")
    assert {p["metadata"]["labels"]["torchyard.dev/attempt"] for p in resumed} == {"1"}
    assert {p["metadata"]["labels"][KUEUE_GROUP] for p in resumed} == {"kq-1"}
    assert all(not gates(p) for p in resumed)
