"""Bad nodes left out, as pure builders: the next attempt's node affinity (``planning
.exclusions``, ``planning.pods``) and gang admission that does not count them for the
run (``planning.admission``)."""

from __future__ import annotations

from typing import Any

from tests.builders import TrainingRunBuilder
from torchyard import api
from torchyard.planning import admission, exclusions, pods

RUN = api.parse_trainingrun(
    TrainingRunBuilder("r", "ns").nodes(2).procs(1).gpus(4).pool("a100").obj()
)


def node_pods(excluded: list[str]) -> list[dict[str, Any]]:
    return pods.pods(RUN, image="img", excluded=excluded)


def test_the_affinity_rules_out_the_nodes_by_name_sorted_once() -> None:
    assert exclusions.node_affinity(["gpu-2", "gpu-1", "gpu-2"]) == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {
                                "key": "metadata.name",
                                "operator": "NotIn",
                                "values": ["gpu-1", "gpu-2"],
                            }
                        ]
                    }
                ]
            }
        }
    }
    assert exclusions.node_affinity([]) is None


def test_node_pods_of_a_run_with_excluded_nodes_carry_the_affinity_and_others_none() -> None:
    bad = node_pods(["gpu-1"])
    assert [exclusions.excluded_of(p) for p in bad] == [frozenset({"gpu-1"})] * 2
    assert all(p["spec"]["nodeSelector"] == {pods.POOL_LABEL: "a100"} for p in bad)
    clean = node_pods([])
    assert all("affinity" not in p["spec"] for p in clean)


def test_excluded_of_reads_only_what_every_term_rules_out() -> None:
    spec: dict[str, Any] = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "NotIn", "values": ["a", "b"]}
                            ]
                        },
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "NotIn", "values": ["b"]}
                            ]
                        },
                    ]
                }
            }
        }
    }
    assert exclusions.excluded_of({"spec": spec}) == frozenset({"b"})
    assert exclusions.excluded_of({"spec": {}}) == frozenset()


def node(name: str, gpus: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {pods.POOL_LABEL: "a100"}},
        "spec": {"taints": []},
        "status": {
            "allocatable": {
                "cpu": "64",
                "memory": "512Gi",
                "nvidia.com/gpu": str(gpus),
                "pods": "110",
            },
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def gang_of(excluded: list[str]) -> admission.Gang:
    gated = node_pods(excluded)
    for p in gated:
        p["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    (gang,) = admission.waiting_gangs(gated)
    return gang


def test_admission_does_not_count_an_excluded_node_and_says_so_in_numbers() -> None:
    nodes = [node("gpu-0", 4), node("gpu-1", 4)]
    clean = admission.decide([gang_of([])], nodes, [])
    assert clean[("ns", "r")].admit
    left_out = admission.decide([gang_of(["gpu-1"])], nodes, [])[("ns", "r")]
    assert not left_out.admit
    assert left_out.message == (
        "needs 2 node(s) with 4 nvidia.com/gpu in pool a100; the pool cannot hold it even "
        "when idle (1 matching node(s); 1 more left out as bad for this run "
        "(status.excludedNodes))"
    )
    # Room on the nodes that remain: admitted there.
    bigger = [node("gpu-0", 8), node("gpu-1", 8)]
    assert admission.decide([gang_of(["gpu-1"])], bigger, [])[("ns", "r")].admit


def test_with_every_node_excluded_admission_says_how_many_were_left_out() -> None:
    nodes = [node("gpu-0", 8)]
    decision = admission.decide([gang_of(["gpu-0"])], nodes, [])[("ns", "r")]
    assert decision.message == (
        "needs 2 node(s) with 4 nvidia.com/gpu in pool a100; no Ready node matches the "
        "pool's selector and tolerations; 1 more left out as bad for this run "
        "(status.excludedNodes)"
    )
