"""A TrainingRun handed to a real Kueue (``scheduling.queueName``), on KWOK GPU nodes.

Kueue's controller manager, built from its Go module (``tests/cluster/kueue.py``, its
feature gates at their defaults: topology-aware scheduling on), admits a run through the
Workload torchyard makes for it (``controller/workloads.py``): its quota is accounted in
the ClusterQueue and released when the run ends; a run of higher priority preempts it
(its Workload evicted: torchyard stops the gang gracefully, counts a suspension, clears
the admission, and Kueue admits it again once the preemptor is done); with
``spec.placement`` Kueue's TAS places the gang in one rack of nodes labelled by block,
rack and host, node ranks rack by rack. The fallback, plain Pod groups, runs where the
cluster's Kueue looks like one without Workload v1beta2.

Part of the integration tier: a run that selects it builds Kueue before its first test
(minutes on 2 cores the first time, cached after: tests/conftest.py). Kueue's CRDs go
with it at the end of the module.

    flock /tmp/ty-cluster.lock .venv/bin/python -m pytest tests/integration/test_kueue.py
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder
from tests.cluster import kueue as kq
from tests.cluster.harness import Cluster, Pool, node_manifest
from tests.cluster.kueue import ADMISSION_GATE, QUEUE_LABEL, Kueue
from tests.cluster.racks import HOST, RACK, Racks, kueue_topology, occupy
from tests.conftest import InProcessOperator
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


def queue(cluster: Cluster, namespace: str, name: str, pool: str, gpus: int = 2) -> str:
    """A ResourceFlavor of ``pool``'s nodes, a ClusterQueue of ``gpus`` GPUs that
    preempts lower priorities, the LocalQueue ``name`` in ``namespace``; the CQ's name."""
    cq = f"{name}-{namespace}"[:63]
    kq.create(
        cluster,
        kq.resource_flavor(f"{name}-{pool}", node_labels={"torchyard.dev/pool": pool}),
        kq.cluster_queue(cq, f"{name}-{pool}", gpus=gpus),
        kq.local_queue(namespace, name, cq),
        kq.priority_class("kueue-test-low", 10),
        kq.priority_class("kueue-test-high", 1000),
    )
    return cq


def kueue_run(
    ns: str, name: str, pool: str, nodes: int = 2, priority: str | None = None
) -> dict[str, Any]:
    b = (
        TrainingRunBuilder(name, ns)
        .environment("pytorch")
        .nodes(nodes)
        .procs(1)
        .gpus(1)
        .pool(pool)
        .with_("spec.scheduling.queueName", "team-a")
        .with_("spec.policy.platformRestartLimit", 0)  # a suspension needs no restart left
    )
    if priority:
        b = b.with_("spec.compute.priorityClassName", priority)
    return b.obj()


def workload_of(ns: str, run: str) -> dict[str, Any] | None:
    """The Workload the run owns (None: none yet)."""
    uid = k8s.get(k8s.TRAININGRUNS, ns, run)["metadata"]["uid"]
    owned = [
        w
        for w in k8s.list_(k8s.WORKLOADS, ns)
        if any(o.get("uid") == uid for o in w["metadata"].get("ownerReferences", []))
    ]
    assert len(owned) <= 1, owned
    return owned[0] if owned else None


def workload_with(ns: str, run: str, type_: str) -> dict[str, Any]:
    """Wait until the run's Workload has condition ``type_`` True."""

    def check() -> dict[str, Any] | None:
        wl = workload_of(ns, run)
        return wl if wl is not None and condition(wl, type_).get("status") == "True" else None

    found: dict[str, Any] = wait_for(f"{run}'s Workload {type_}", check, timeout=60)
    return found


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_), {})


def gpus_reserved(cq: str) -> int:
    """What the ClusterQueue has reserved of nvidia.com/gpu (its status)."""
    body = k8s.rest.call("GET", f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{cq}")
    total = 0
    for flavor in body.get("status", {}).get("flavorsReservation", []):
        for res in flavor.get("resources", []):
            if res["name"] == "nvidia.com/gpu":
                total += int(res["total"])
    return total


def events(namespace: str, name: str) -> list[dict[str, Any]]:
    return [
        e
        for e in k8s.list_(k8s.EVENTS, namespace)
        if e.get("involvedObject", {}).get("name") == name
    ]


def gates(pod: dict[str, Any]) -> list[str]:
    return [g["name"] for g in pod["spec"].get("schedulingGates") or []]


def test_a_run_is_admitted_through_its_workload_with_its_quota_accounted(
    cluster: Cluster, kueue: Kueue, env: str, pool: Pool
) -> None:
    ns = env
    cq = queue(cluster, ns, "team-a", pool.name, gpus=4)
    k8s.create(kueue_run(ns, "acct", pool.name))
    # Kueue admits the Workload torchyard made; only then are the node Pods created
    wl = workload_with(ns, "acct", "Admitted")
    assert [(ps["name"], ps["count"]) for ps in wl["spec"]["podSets"]] == [
        ("node-0", 1),
        ("nodes", 1),
    ]
    assert wl["spec"]["queueName"] == "team-a"
    owner = wl["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("TrainingRun", "acct", True)
    run = running(ns, "acct", timeout=60)
    assert wait_for("2 GPUs reserved in the ClusterQueue", lambda: gpus_reserved(cq) == 2)
    pods = run_pods(ns, "acct")
    assert all(not gates(p) for p in pods)
    # torchyard's Pods of an admitted Workload: no Pod group of Kueue's Pod integration
    assert not any(QUEUE_LABEL in p["metadata"]["labels"] for p in pods)
    assert {p["metadata"]["labels"]["kueue.x-k8s.io/podset"] for p in pods} == {"node-0", "nodes"}
    admitted = condition(run, "Admitted")
    assert admitted["message"].startswith(f"admitted by Kueue's ClusterQueue {cq}"), admitted

    for p in pods:
        finish_pod(cluster, ns, p["metadata"]["name"], 0)
    wait_status(k8s.TRAININGRUNS, ns, "acct", lambda s: s.get("phase") == "Succeeded", timeout=60)
    done = workload_with(ns, "acct", "Finished")
    assert condition(done, "Finished")["reason"] == "Succeeded"
    assert wait_for("the quota released", lambda: gpus_reserved(cq) == 0, timeout=30) is not None


def test_a_run_waits_in_kueue_saying_why_and_holds_no_pods(
    cluster: Cluster, kueue: Kueue, env: str, pool: Pool
) -> None:
    """A gang bigger than the ClusterQueue's quota: Queued with Kueue's own words."""
    ns = env
    queue(cluster, ns, "team-a", pool.name, gpus=2)
    k8s.create(kueue_run(ns, "big", pool.name, nodes=3))
    waiting = wait_status(
        k8s.TRAININGRUNS,
        ns,
        "big",
        lambda s: s.get("phase") == "Queued" and "insufficient" in str(s.get("conditions")),
        timeout=60,
    )["status"]
    admitted = next(c for c in waiting["conditions"] if c["type"] == "Admitted")
    assert admitted["reason"] == "Queued"
    assert admitted["message"].startswith("waiting in Kueue's LocalQueue team-a (Workload ")
    assert "nvidia.com/gpu" in admitted["message"], admitted["message"]
    assert run_pods(ns, "big") == []


def test_a_higher_priority_run_preempts_a_run_which_is_requeued_and_resumes(
    cluster: Cluster, kueue: Kueue, env: str, pool: Pool
) -> None:
    ns = env
    cq = queue(cluster, ns, "team-a", pool.name, gpus=2)
    k8s.create(kueue_run(ns, "low", pool.name, priority="kueue-test-low"))
    first = running(ns, "low", timeout=90)
    assert first["status"]["restarts"] == 0
    low_wl = workload_with(ns, "low", "Admitted")["metadata"]["name"]

    k8s.create(kueue_run(ns, "high", pool.name, priority="kueue-test-high"))
    stopped = wait_status(
        k8s.TRAININGRUNS, ns, "low", lambda s: s.get("suspensions") == 1, timeout=90
    )["status"]
    assert stopped["restarts"] == 1
    assert "failure" not in stopped and "failedAttempts" not in stopped  # no limit used

    def said_so() -> list[str] | None:
        said = [e["message"] for e in events(ns, "low") if e.get("reason") == "Restarting"]
        found = [m for m in said if "as a suspension" in m and "Kueue evicted" in m]
        return found or None

    (message, *_) = wait_for("the Restarting Event that says Kueue evicted it", said_so, timeout=60)
    assert "Preempted" in message, message

    # Its Pods gone, the Workload's admission is cleared and Kueue queues it again, while
    # the preemptor holds the quota; the preempted run is Queued, with no Pods.
    def requeued() -> dict[str, Any] | None:
        wl = k8s.get(k8s.WORKLOADS, ns, low_wl)
        ok = condition(wl, "QuotaReserved").get("status") == "False" and not wl["status"].get(
            "admission"
        )
        return wl if ok else None

    wl = wait_for("the preempted Workload requeued", requeued, timeout=60)
    assert condition(wl, "Requeued").get("status") == "True"
    running(ns, "high", timeout=60)
    # the ClusterQueue's status is Kueue's to write, a moment after it admitted the run
    wait_for("the preemptor's 2 GPUs reserved", lambda: gpus_reserved(cq) == 2, timeout=30)
    low = k8s.get(k8s.TRAININGRUNS, ns, "low")["status"]
    assert low["phase"] == "Queued", low
    assert run_pods(ns, "low") == []

    for p in run_pods(ns, "high"):
        finish_pod(cluster, ns, p["metadata"]["name"], 0)
    wait_status(k8s.TRAININGRUNS, ns, "high", lambda s: s.get("phase") == "Succeeded", timeout=60)
    again = wait_status(
        k8s.TRAININGRUNS,
        ns,
        "low",
        lambda s: s.get("phase") == "Running" and s.get("nodes", {}).get("running") == 2,
        timeout=120,
    )["status"]
    assert (again["restarts"], again["suspensions"]) == (1, 1)
    assert "failure" not in again
    resumed = run_pods(ns, "low")
    assert {p["metadata"]["labels"]["torchyard.dev/attempt"] for p in resumed} == {"1"}


def placed_run(ns: str, name: str, pool: str, nodes: int, mode: str) -> dict[str, Any]:
    b = TrainingRunBuilder(name, ns).nodes(nodes).gpus(8).procs(8).pool(pool).placement(RACK, mode)
    return b.with_("spec.scheduling.queueName", "tas").obj()


def racks_by_rank(racks: Racks, ns: str, run: str) -> list[str]:
    return racks.racks_by_rank(run_pods(ns, run))


def test_kueue_places_a_required_gang_in_one_rack_with_ranks_rack_by_rack(
    cluster: Cluster, kueue: Kueue, env: str, racks: Racks
) -> None:
    ns = env
    topo = f"{racks.pool}-topology"
    kq.create(
        cluster,
        kueue_topology(topo),
        kq.resource_flavor(
            racks.pool, node_labels={"torchyard.dev/pool": racks.pool}, topology=topo
        ),
        kq.cluster_queue(f"tas-{ns}", racks.pool, gpus=8 * racks.size),
        kq.local_queue(ns, "tas", f"tas-{ns}"),
    )
    # rack b0-r0 has 3 free nodes, b0-r1 2, b1-r0 4, b1-r1 4
    occupy(cluster, ns, [racks.name(0), racks.name(4), racks.name(5)])

    k8s.create(placed_run(ns, "four", racks.pool, 4, "required"))
    running(ns, "four", timeout=90)
    (rack,) = set(racks_by_rank(racks, ns, "four"))
    assert rack in ("b1-r0", "b1-r1")  # the racks with 4 free nodes
    pods = run_pods(ns, "four")
    for p in pods:  # each Pod pinned to the host Kueue's TAS assigned, a TAS Pod
        assert p["spec"]["nodeSelector"][HOST] == p["spec"]["nodeName"]
        assert p["metadata"]["annotations"]["kueue.x-k8s.io/podset-required-topology"] == RACK
    admitted = condition(k8s.get(k8s.TRAININGRUNS, ns, "four"), "Admitted")
    assert admitted["message"].endswith(f"in {RACK} {rack} (node ranks 0-3)"), admitted

    # Six nodes preferred: no rack holds them; two racks, node ranks rack by rack
    k8s.create(placed_run(ns, "six", racks.pool, 6, "preferred"))
    running(ns, "six", timeout=90)
    by_rank = racks_by_rank(racks, ns, "six")
    assert len(set(by_rank)) == 2, by_rank
    assert by_rank == sorted(by_rank, key=by_rank.index), by_rank  # contiguous per rack

    # Five required: no rack has five free nodes now: it waits, in Kueue's words
    k8s.create(placed_run(ns, "five", racks.pool, 5, "required"))
    waiting = wait_status(
        k8s.TRAININGRUNS,
        ns,
        "five",
        lambda s: s.get("phase") == "Queued" and "Workload" in str(s.get("conditions")),
        timeout=60,
    )["status"]
    message = next(c for c in waiting["conditions"] if c["type"] == "Admitted")["message"]
    assert "waiting in Kueue's LocalQueue tas" in message, message
    assert run_pods(ns, "five") == []


def test_where_kueue_serves_no_workload_v1beta2_runs_go_as_plain_pod_groups(
    cluster: Cluster, kueue: Kueue, env: str, pool: Pool, operator: InProcessOperator
) -> None:
    """The fallback: the operator's view of Kueue made that of a Kueue without Workload
    v1beta2 (what ``workloads.served`` would have read from its CRD), so the run's node
    Pods are a plain Pod group Kueue's Pod integration admits; Kueue preempting it stops
    the Pods (TerminationTarget), and the gang restarts as a suspension."""
    ctx = operator.memo.ctx
    ctx.kueue["workloads"] = (datetime.now(timezone.utc) + timedelta(hours=1), False)
    try:
        _pod_groups(cluster, env, pool)
    finally:
        ctx.kueue.pop("workloads", None)


def _pod_groups(cluster: Cluster, ns: str, pool: Pool) -> None:
    queue(cluster, ns, "team-a", pool.name)
    k8s.create(kueue_run(ns, "kq", pool.name))
    first = running(ns, "kq", timeout=120)
    pods = run_pods(ns, "kq")
    # Kueue's webhook took the Pods (its label), and Kueue, not torchyard, admitted them.
    assert {p["metadata"]["labels"].get("kueue.x-k8s.io/managed") for p in pods} == {"true"}
    assert all(not gates(p) for p in pods)
    assert {p["metadata"]["labels"][KUEUE_GROUP] for p in pods} == {"kq-0"}
    assert first["status"]["restarts"] == 0
    assert [
        w for w in k8s.list_(k8s.WORKLOADS, ns) if "trainingrun-kq" in w["metadata"]["name"]
    ] == []

    k8s.create(preemptor(ns, pool.name, "team-a"))
    stopped = wait_status(
        k8s.TRAININGRUNS, ns, "kq", lambda s: s.get("suspensions") == 1, timeout=120
    )["status"]
    assert stopped["restarts"] == 1
    assert "failure" not in stopped and "failedAttempts" not in stopped

    # The next attempt's Pod group waits, gated by Kueue, while the preemptor runs.
    def next_group_gated() -> list[dict[str, Any]] | None:
        now = run_pods(ns, "kq")
        attempt = [p for p in now if p["metadata"]["labels"][KUEUE_GROUP] == "kq-1"]
        if len(attempt) == 2 and all(ADMISSION_GATE in gates(p) for p in attempt):
            return attempt
        return None

    wait_for("the next attempt's Pods gated by Kueue", next_group_gated, timeout=120)
    wait_status(k8s.PODS, ns, "urgent", lambda s: s.get("phase") == "Running", timeout=120)
    finish_pod(cluster, ns, "urgent", 0)
    again = wait_status(
        k8s.TRAININGRUNS,
        ns,
        "kq",
        lambda s: s.get("phase") == "Running" and s.get("nodes", {}).get("running") == 2,
        timeout=180,
    )["status"]
    assert (again["restarts"], again["suspensions"]) == (1, 1)
    assert {p["metadata"]["labels"][KUEUE_GROUP] for p in run_pods(ns, "kq")} == {"kq-1"}


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
