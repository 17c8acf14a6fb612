"""What admission counts as fitting: a Pod's requests, a node's free room, its readiness,
its taints and labels; each rule as a table."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from torchyard.planning import admission


def container(requests: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> Any:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"resources": resources}


@pytest.mark.parametrize(
    ("containers", "asked"),
    [
        ([], {"pods": 1}),
        ([container({"cpu": "500m", "memory": "1Gi"})], {"pods": 1, "cpu": "0.5", "memory": 2**30}),
        ([container(limits={"nvidia.com/gpu": "2"})], {"pods": 1, "nvidia.com/gpu": 2}),
        ([container({"cpu": "1"}, {"cpu": "4"})], {"pods": 1, "cpu": 1}),  # the request wins
        (
            [container({"cpu": "1"}), container({"cpu": "2", "ephemeral-storage": "1Gi"})],
            {"pods": 1, "cpu": 3},
        ),
    ],
)
def test_a_pod_asks_for_its_containers_requests_limits_where_none_and_one_slot(
    containers: list[Any], asked: dict[str, Any]
) -> None:
    pod = {"spec": {"containers": containers}}
    assert admission.pod_requests(pod) == {k: Decimal(v) for k, v in asked.items()}


def ready_node(name: str, **extra: Any) -> dict[str, Any]:
    node: dict[str, Any] = {
        "metadata": {"name": name, "labels": {"pool": "a"}},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "8", "memory": "16Gi", "nvidia.com/gpu": "4", "pods": "10"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    for key, value in extra.items():
        section, field = key.split("__")
        node[section][field] = value
    return node


def bound(node: str, phase: str, gpus: str) -> dict[str, Any]:
    return {
        "spec": {"nodeName": node, "containers": [container({"nvidia.com/gpu": gpus})]},
        "status": {"phase": phase},
    }


def test_free_room_is_allocatable_less_what_live_pods_bound_there_ask() -> None:
    nodes = [
        ready_node("n2"),
        ready_node("n1"),
        ready_node("cordoned", spec__unschedulable=True),
        ready_node("not-ready", status__conditions=[{"type": "Ready", "status": "False"}]),
        ready_node("no-condition", status__conditions=[{"type": "DiskPressure", "status": "True"}]),
    ]
    pods = [
        bound("n1", "Running", "1"),
        bound("n1", "Pending", "2"),
        bound("n1", "Succeeded", "4"),  # ended: its room is free again
        bound("n1", "Failed", "4"),
        bound("elsewhere", "Running", "1"),
        {"spec": {"containers": [container({"nvidia.com/gpu": "1"})]}},  # not bound
    ]
    free = admission.free_nodes(nodes, pods)
    assert [n.name for n in free] == ["n1", "n2"]  # ready ones, by name
    assert free[0].free == {
        "cpu": Decimal(8),
        "memory": Decimal(16 * 2**30),
        "nvidia.com/gpu": Decimal(1),
        "pods": Decimal(8),
    }
    assert free[0].labels == {"pool": "a"} and free[1].free["nvidia.com/gpu"] == Decimal(4)


def test_a_node_fits_a_request_up_to_its_last_unit_and_taking_it_leaves_none() -> None:
    node = admission.Node("n", {}, [], {"nvidia.com/gpu": Decimal(2), "pods": Decimal(3)})
    exactly = {"nvidia.com/gpu": Decimal(2), "pods": Decimal(1)}
    assert node.fits(exactly)
    assert not node.fits({"nvidia.com/gpu": Decimal(3)})
    assert not node.fits({"cpu": Decimal("0.1")})  # what it does not have, it cannot give
    assert node.fits({})
    node.take(exactly)
    assert node.free == {"nvidia.com/gpu": Decimal(0), "pods": Decimal(2)}
    assert not node.fits(exactly)
    node.take({"cpu": Decimal(1)})
    assert node.free["cpu"] == Decimal(-1)


NO_SCHEDULE = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("tolerations", "taint", "tolerated"),
    [
        ([], NO_SCHEDULE, False),
        ([], {**NO_SCHEDULE, "effect": "PreferNoSchedule"}, True),  # only a preference
        ([{"operator": "Exists"}], NO_SCHEDULE, True),  # every taint
        ([{"key": "nvidia.com/gpu", "operator": "Exists"}], NO_SCHEDULE, True),
        ([{"key": "other", "operator": "Exists"}], NO_SCHEDULE, False),
        (
            [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}],
            NO_SCHEDULE,
            False,
        ),
        (
            [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            NO_SCHEDULE,
            True,
        ),
        ([{"key": "nvidia.com/gpu", "value": "present"}], NO_SCHEDULE, True),  # Equal
        ([{"key": "nvidia.com/gpu", "value": "absent"}], NO_SCHEDULE, False),
        ([{"key": "nvidia.com/gpu"}], NO_SCHEDULE, False),  # no value is not "present"
        ([{"key": "nvidia.com/gpu"}], {"key": "nvidia.com/gpu", "effect": "NoSchedule"}, True),
        ([{"key": "x", "value": "present"}], NO_SCHEDULE, False),
        (
            [{"key": "x", "operator": "Exists"}, {"key": "nvidia.com/gpu", "value": "present"}],
            NO_SCHEDULE,
            True,
        ),
        (  # one toleration of another effect does not end the search
            [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"},
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            ],
            NO_SCHEDULE,
            True,
        ),
    ],
)
def test_taints_are_tolerated_as_kubernetes_tolerates_them(
    tolerations: list[dict[str, str]], taint: dict[str, str], tolerated: bool
) -> None:
    assert admission._tolerates(tolerations, taint) is tolerated


def test_a_node_is_eligible_when_it_has_every_label_tolerates_and_is_not_excluded() -> None:
    node = admission.Node("n", {"pool": "a", "zone": "z1"}, [NO_SCHEDULE], {})
    tolerate = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert admission.eligible(node, {"pool": "a"}, tolerate)
    assert admission.eligible(node, {"pool": "a", "zone": "z1"}, tolerate)
    assert not admission.eligible(node, {"pool": "a", "zone": "z2"}, tolerate)
    assert not admission.eligible(node, {"gpu": "h100"}, tolerate)
    assert not admission.eligible(node, {"pool": "a"}, [])
    assert not admission.eligible(node, {"pool": "a"}, tolerate, frozenset({"n"}))
    assert admission.eligible(node, {"pool": "a"}, tolerate, frozenset({"m"}))


def test_objects_that_leave_out_what_they_do_not_need_are_read_as_empty() -> None:
    assert admission.pod_requests({}) == {"pods": Decimal(1)}
    assert admission.pod_requests({"spec": {"containers": [{}]}}) == {"pods": Decimal(1)}
    bare_node = {
        "metadata": {"name": "bare"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    no_status = {"metadata": {"name": "no-status"}, "spec": {}}
    pods = [{"spec": {"nodeName": "bare"}}, {}]  # no status: not ended; no spec: not bound
    [node] = admission.free_nodes([no_status, bare_node], pods)
    assert (node.name, node.labels, list(node.taints)) == ("bare", {}, [])
    assert node.free == {"pods": Decimal(-1)}


@pytest.mark.parametrize(
    ("pod", "gated"),
    [
        ({"spec": {"schedulingGates": [{"name": admission.GANG_GATE}]}}, True),
        ({"spec": {"schedulingGates": [{"name": "other"}, {"name": admission.GANG_GATE}]}}, True),
        ({"spec": {"schedulingGates": [{"name": "other"}]}}, False),
        ({"spec": {}}, False),
        ({}, False),
    ],
)
def test_a_pod_waits_for_admission_while_it_has_the_gang_gate(pod: Any, gated: bool) -> None:
    assert admission.is_gated(pod) is gated
