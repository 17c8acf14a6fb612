"""A TrainingRun as a Kueue Workload (``planning.workloads``): its PodSets and topology
request, the admission read back into each node rank's placement, and the status writes
of the job's controller."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder
from torchyard import api
from torchyard.planning import workloads
from torchyard.planning.topology import Request

BLOCK, RACK, HOST = "example.com/block", "example.com/rack", "kubernetes.io/hostname"
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)


def run(nodes: int = 4, **fields: Any) -> api.TrainingRun:
    b = (
        TrainingRunBuilder("train", "team")
        .nodes(nodes)
        .gpus(8)
        .pool("a100")
        .with_("spec.scheduling.queueName", "team-a")
        .with_("metadata.uid", "0a1b2c3d-4e5f-6789-abcd-ef0123456789")
    )
    for path, value in fields.items():
        b = b.with_(path.replace("__", "."), value)
    return api.parse_trainingrun(b.obj())


def test_the_workload_has_a_podset_per_role_owned_by_the_run_in_its_queue() -> None:
    wl = workloads.workload(run(4), 4)
    assert wl["metadata"]["name"] == "trainingrun-train-0a1b2c3d"
    assert wl["metadata"]["namespace"] == "team"
    assert wl["metadata"]["ownerReferences"][0]["kind"] == "TrainingRun"
    assert wl["metadata"]["ownerReferences"][0]["controller"] is True
    spec = wl["spec"]
    assert spec["queueName"] == "team-a"
    assert spec["active"] is True
    assert [(ps["name"], ps["count"]) for ps in spec["podSets"]] == [("node-0", 1), ("nodes", 3)]
    pod = spec["podSets"][1]["template"]["spec"]
    assert pod["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "8"
    assert pod["nodeSelector"] == {"torchyard.dev/pool": "a100"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in (
        pod["tolerations"]
    )
    assert "priorityClassRef" not in spec


def test_the_node_count_is_the_builders_not_the_specs() -> None:
    """An elastic run builds its Workload for the size it asks for."""
    wl = workloads.workload(run(4), 7)
    assert [ps["count"] for ps in wl["spec"]["podSets"]] == [1, 6]
    assert [ps["name"] for ps in workloads.workload(run(1), 1)["spec"]["podSets"]] == ["node-0"]


def test_a_priority_class_gives_the_workload_its_value() -> None:
    r = run(2, spec__compute__priorityClassName="urgent")
    wl = workloads.workload(r, 2, priority=1000)
    assert wl["spec"]["priorityClassRef"] == {
        "group": "scheduling.k8s.io",
        "kind": "PriorityClass",
        "name": "urgent",
    }
    assert wl["spec"]["priority"] == 1000
    assert wl["spec"]["podSets"][0]["template"]["spec"]["priorityClassName"] == "urgent"


def test_a_suspended_run_has_an_inactive_workload() -> None:
    assert workloads.workload(run(2, spec__suspend=True), 2)["spec"]["active"] is False


@pytest.mark.parametrize(
    ("req", "topology_request", "annotations"),
    [
        (
            Request((BLOCK, RACK), "required"),
            {"required": RACK},
            {"kueue.x-k8s.io/podset-required-topology": RACK},
        ),
        (
            Request((RACK,), "preferred"),
            {"preferred": RACK},
            {"kueue.x-k8s.io/podset-preferred-topology": RACK},
        ),
    ],
)
def test_a_placement_is_one_podset_of_every_node_with_its_topology_request(
    req: Request, topology_request: dict[str, Any], annotations: dict[str, str]
) -> None:
    """No PodSet group (node 0 as a leader): Kueue v0.17 fails to place one that spans
    domains."""
    wl = workloads.workload(run(4), 4, request=req)
    (ps,) = wl["spec"]["podSets"]
    assert (ps["name"], ps["count"]) == ("nodes", 4)
    assert ps["topologyRequest"] == topology_request
    assert ps["template"]["metadata"]["annotations"] == annotations


def test_without_a_placement_node_0_and_the_others_are_two_podsets() -> None:
    wl = workloads.workload(run(4), 4)
    assert [(ps["name"], ps["count"]) for ps in wl["spec"]["podSets"]] == [
        ("node-0", 1),
        ("nodes", 3),
    ]
    assert not any("topologyRequest" in ps for ps in wl["spec"]["podSets"])


def test_a_sliced_placement_is_one_podset_of_every_node() -> None:
    wl = workloads.workload(run(8), 8, request=Request((RACK,), "required", 4))
    (ps,) = wl["spec"]["podSets"]
    assert (ps["name"], ps["count"]) == ("nodes", 8)
    assert ps["topologyRequest"] == {
        "preferred": RACK,
        "podSetSliceRequiredTopology": RACK,
        "podSetSliceSize": 4,
    }


def test_multikueues_copy_uses_the_workload_multikueue_made() -> None:
    r = run(2, metadata__labels={"kueue.x-k8s.io/prebuilt-workload-name": "wl-from-manager"})
    assert workloads.prebuilt(r)
    assert workloads.name(r) == "wl-from-manager"
    wl = {"metadata": {"name": "wl-from-manager", "resourceVersion": "7", "ownerReferences": []}}
    patch = workloads.adoption(wl, r)
    assert patch is not None
    (owner,) = patch["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("TrainingRun", "train", True)
    assert patch["metadata"]["resourceVersion"] == "7"
    owned = {"metadata": {"name": "x", "ownerReferences": [owner]}}
    assert workloads.adoption(owned, r) is None


def admitted(
    *assignments: dict[str, Any],
    checks: list[dict[str, Any]] | None = None,
    request: Request | None = None,
) -> Any:
    return {
        "metadata": {"name": "trainingrun-train-0a1b2c3d", "resourceVersion": "42"},
        "spec": workloads.workload(run(4), 4, request=request)["spec"],
        "status": {
            "conditions": [
                {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                {"type": "Admitted", "status": "True", "reason": "Admitted"},
            ],
            "admission": {"clusterQueue": "cq", "podSetAssignments": list(assignments)},
            "admissionChecks": checks or [],
        },
    }


def hosts(*names: str, counts: int = 1) -> dict[str, Any]:
    return {
        "levels": [HOST],
        "slices": [
            {
                "domainCount": len(names),
                "valuesPerLevel": [{"individual": {"prefix": "node-", "roots": list(names)}}],
                "podCounts": {"universal": counts},
            }
        ],
    }


NODE_LABELS = {
    f"node-{i}": {BLOCK: f"b{i // 4}", RACK: f"r{i // 2}", HOST: f"node-{i}"} for i in range(8)
}
FLAVORS = {
    "gpu": {
        "spec": {
            "nodeLabels": {"cloud/instance": "a3"},
            "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
        }
    }
}


def test_decode_expands_prefixes_suffixes_and_universal_values() -> None:
    assignment = {
        "levels": [BLOCK, RACK],
        "slices": [
            {
                "domainCount": 2,
                "valuesPerLevel": [
                    {"universal": "b1"},
                    {"individual": {"prefix": "r-", "suffix": "-x", "roots": ["1", "2"]}},
                ],
                "podCounts": {"individual": [3, 1]},
            }
        ],
    }
    assert workloads.decode(assignment) == [
        ({BLOCK: "b1", RACK: "r-1-x"}, 3),
        ({BLOCK: "b1", RACK: "r-2-x"}, 1),
    ]


def test_node_ranks_follow_racks_block_by_block() -> None:
    """Kueue assigns hosts to the one PodSet; a host's rack comes from its Node: the
    nodes of one rack get consecutive ranks, racks in order."""
    wl = admitted(
        {
            "name": "nodes",
            "flavors": {"nvidia.com/gpu": "gpu"},
            "topologyAssignment": hosts("7", "4", "6", "5"),
        },
        request=Request((BLOCK, RACK), "required"),
    )
    placed = workloads.placements(wl, 4, FLAVORS, NODE_LABELS, Request((BLOCK, RACK)))
    assert [p.node_selector[HOST] for p in placed] == ["node-4", "node-5", "node-6", "node-7"]
    assert [NODE_LABELS[p.node_selector[HOST]][RACK] for p in placed] == ["r2", "r2", "r3", "r3"]
    for p in placed:
        assert p.node_selector["cloud/instance"] == "a3"  # the flavor's node labels
        assert {"key": "spot", "operator": "Exists", "effect": "NoSchedule"} in p.tolerations
        # a TAS Pod (Kueue counts it once), of its Workload and PodSet
        assert p.annotations["kueue.x-k8s.io/podset-required-topology"] == RACK
        assert p.annotations["kueue.x-k8s.io/workload"] == "trainingrun-train-0a1b2c3d"
        assert p.labels["kueue.x-k8s.io/podset"] == "nodes"


def test_with_two_podsets_node_0s_rack_comes_first() -> None:
    """A run without a placement on a TAS flavor (Kueue assigns both PodSets hosts, no
    request): node 0 went to node-5 (rack r2), the other nodes of r2 get ranks 1.., then
    rack r3's; the Pods say they are unconstrained TAS Pods."""
    wl = admitted(
        {"name": "node-0", "flavors": {"nvidia.com/gpu": "gpu"}, "topologyAssignment": hosts("5")},
        {
            "name": "nodes",
            "flavors": {"nvidia.com/gpu": "gpu"},
            "topologyAssignment": hosts("7", "4", "6"),
        },
    )
    placed = workloads.placements(wl, 4, FLAVORS, NODE_LABELS, Request((BLOCK, RACK)))
    assert [p.node_selector[HOST] for p in placed] == ["node-5", "node-4", "node-6", "node-7"]
    assert [p.labels["kueue.x-k8s.io/podset"] for p in placed] == ["node-0"] + ["nodes"] * 3
    assert all(p.annotations["kueue.x-k8s.io/podset-unconstrained-topology"] for p in placed)


def test_an_admission_without_topology_gives_the_flavors_and_checks_updates() -> None:
    checks = [
        {
            "name": "prov",
            "state": "Ready",
            "podSetUpdates": [{"name": "nodes", "nodeSelector": {"zone": "z1"}}],
        }
    ]
    wl = admitted(
        {"name": "node-0", "flavors": {"nvidia.com/gpu": "gpu"}},
        {"name": "nodes", "flavors": {"nvidia.com/gpu": "gpu"}},
        checks=checks,
    )
    placed = workloads.placements(wl, 4, FLAVORS, NODE_LABELS)
    assert placed[0].node_selector == {"cloud/instance": "a3"}
    assert [p.node_selector for p in placed[1:]] == [{"cloud/instance": "a3", "zone": "z1"}] * 3
    assert not any("kueue.x-k8s.io/podset-unconstrained-topology" in p.annotations for p in placed)


def test_states_of_a_workload() -> None:
    wl = admitted({"name": "nodes"})
    assert workloads.admitted(wl) and workloads.reserved(wl) and not workloads.evicted(wl)
    evicted = {
        **wl,
        "status": {
            **wl["status"],
            "conditions": [
                *wl["status"]["conditions"],
                {
                    "type": "Evicted",
                    "status": "True",
                    "reason": "Preempted",
                    "message": "Preempted to accommodate a workload (UID: u) due to prioritization",
                },
            ],
        },
    }
    assert workloads.evicted(evicted) and not workloads.admitted(evicted)
    assert workloads.eviction(evicted) == (
        "Preempted: Preempted to accommodate a workload (UID: u) due to prioritization"
    )


def test_the_requeue_patch_clears_the_admission_as_the_job_framework_does() -> None:
    wl = admitted({"name": "nodes"})
    wl["status"]["conditions"].append(
        {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "by urgent"}
    )
    patch = workloads.requeue_patch(wl, NOW)
    assert patch["metadata"] == {"resourceVersion": "42"}
    assert patch["status"]["admission"] is None
    conds = {c["type"]: c for c in patch["status"]["conditions"]}
    assert (conds["QuotaReserved"]["status"], conds["QuotaReserved"]["reason"]) == (
        "False",
        "Pending",
    )
    assert conds["Admitted"]["status"] == "False"
    assert (conds["Requeued"]["status"], conds["Requeued"]["reason"]) == ("True", "Preempted")
    assert conds["Evicted"]["status"] == "True"  # Kueue's own: kept as it is


def test_a_deactivated_workload_is_not_requeued() -> None:
    wl = admitted({"name": "nodes"})
    wl["status"]["conditions"].append(
        {"type": "Evicted", "status": "True", "reason": "Deactivated", "message": "inactive"}
    )
    conds = {c["type"]: c for c in workloads.requeue_patch(wl, NOW)["status"]["conditions"]}
    assert conds["Requeued"]["status"] == "False"


def test_finished_and_active_writes() -> None:
    wl = admitted({"name": "nodes"})
    wl["metadata"]["namespace"] = "team"
    done = workloads.finished_status(wl, False, "rank 3 failed", NOW)
    (cond,) = done["status"]["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("Finished", "True", "Failed")
    assert done["metadata"] == {"name": "trainingrun-train-0a1b2c3d", "namespace": "team"}
    assert workloads.activation(wl, False)["spec"] == {"active": False}


def test_why_a_workload_waits_is_kueues_message() -> None:
    wl = {
        "metadata": {"name": "w"},
        "status": {
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "False",
                    "reason": "Pending",
                    "message": "couldn't assign flavors to pod set nodes: insufficient quota",
                }
            ]
        },
    }
    assert workloads.waiting_message(wl, "team-a") == (
        "waiting in Kueue's LocalQueue team-a (Workload w): couldn't assign flavors to pod "
        "set nodes: insufficient quota"
    )
    assert workloads.waiting_message({"metadata": {"name": "w"}}, "team-a") == (
        "waiting in Kueue's LocalQueue team-a (Workload w)"
    )
