"""torchyard's own gang admission with ``spec.placement``: the gang packed into the fewest
racks, node ranks rack by rack, and the words of a gang that waits for one."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Any

from tests.cluster.harness import Pool, node_manifest
from torchyard.planning import admission
from torchyard.planning.topology import Request

BLOCK, RACK = "example.com/block", "example.com/rack"
POOL = Pool("tas", nodes=16, gpus=8, cpu="96", memory="1Ti")


def rack_nodes() -> list[dict[str, Any]]:
    """16 nodes: 2 blocks x 2 racks x 4 nodes, Ready."""
    out = []
    for i in range(POOL.nodes):
        node = node_manifest(POOL, i)
        node["metadata"]["labels"][BLOCK] = f"b{i // 8}"
        node["metadata"]["labels"][RACK] = f"r{i // 4}"
        node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        out.append(node)
    return out


NODES = rack_nodes()


def gang(name: str, size: int, req: Request | None, created: str = "2026-01-01T00:00:00Z") -> Any:
    return admission.Gang(
        key=("ns", name),
        created=created,
        size=size,
        request={"nvidia.com/gpu": Decimal(8), "pods": Decimal(1)},
        selector={"torchyard.dev/pool": "tas"},
        pool="tas",
        placement=req,
    )


def busy(*nodes: int) -> list[dict[str, Any]]:
    return [
        {
            "metadata": {"name": f"busy-{i}"},
            "spec": {
                "nodeName": f"tas-{i}",
                "containers": [{"resources": {"requests": {"nvidia.com/gpu": "8"}}}],
            },
            "status": {"phase": "Running"},
        }
        for i in nodes
    ]


REQUIRED = Request((BLOCK, RACK), "required")
PREFERRED = Request((BLOCK, RACK), "preferred")


def test_a_required_gang_goes_to_the_fullest_rack_that_holds_it() -> None:
    # rack r0 has 1 free node, r1 3, r2 and r3 4: three nodes go to r1 (best fit)
    d = admission.decide([gang("a", 3, REQUIRED)], NODES, busy(0, 1, 2, 4))[("ns", "a")]
    assert d.admit
    assert d.selectors == ({BLOCK: "b0", RACK: "r1"},) * 3
    assert d.message.endswith(" in example.com/rack r1 (node ranks 0-2)")


def test_a_required_gang_no_rack_holds_waits_saying_the_largest_free_rack() -> None:
    d = admission.decide([gang("a", 4, REQUIRED)], NODES, busy(0, 4, 8, 12))[("ns", "a")]
    assert not d.admit
    assert d.message == (
        "needs 4 node(s) with 8 nvidia.com/gpu in pool tas in one example.com/rack; "
        "the largest free example.com/rack has 3"
    )
    assert d.blocking  # the head of its pool's queue: those behind it wait


def test_a_preferred_gang_spans_the_fewest_racks_of_one_block_with_ranks_rack_by_rack() -> None:
    d = admission.decide([gang("a", 6, PREFERRED)], NODES, busy(0, 1, 4, 5, 8))[("ns", "a")]
    assert d.admit
    # b0 holds 2 + 2 free, b1 3 + 4: six only in block 1, 2 racks
    racks = [s[RACK] for s in d.selectors]
    assert racks == ["r2", "r2", "r3", "r3", "r3", "r3"]
    assert {s[BLOCK] for s in d.selectors} == {"b1"}


def test_two_gangs_of_one_pass_take_different_racks() -> None:
    d = admission.decide(
        [
            gang("a", 4, REQUIRED, "2026-01-01T00:00:00Z"),
            gang("b", 4, REQUIRED, "2026-01-01T00:00:01Z"),
        ],
        NODES,
        busy(0, 4),
    )
    racks = {key: {s[RACK] for s in d[key].selectors} for key in d}
    assert d[("ns", "a")].admit and d[("ns", "b")].admit
    assert len(racks[("ns", "a")]) == len(racks[("ns", "b")]) == 1
    assert racks[("ns", "a")] != racks[("ns", "b")]
    assert racks[("ns", "a")] | racks[("ns", "b")] <= {"r2", "r3"}  # the whole racks


def test_a_level_no_node_has_never_fits_and_says_so_without_blocking_the_pool() -> None:
    req = Request(("example.com/nvlink",), "required")
    d = admission.decide([gang("a", 2, req)], NODES, [])[("ns", "a")]
    assert not d.admit and not d.blocking
    assert "has the label example.com/nvlink (spec.placement.topology.level)" in d.message


def test_a_required_gang_bigger_than_any_rack_never_fits_and_says_so() -> None:
    d = admission.decide([gang("a", 5, REQUIRED)], NODES, [])[("ns", "a")]
    assert not d.admit and not d.blocking
    assert "no example.com/rack can hold 5 of its nodes even when idle (the largest holds 4)" in (
        d.message
    )


def test_slices_of_a_gang_each_stay_in_one_rack() -> None:
    req = Request((BLOCK, RACK), "required", 2)
    # every rack has 3 free nodes: slices of 2 -> one slice per rack, 3 racks for 6
    d = admission.decide([gang("a", 6, req)], NODES, busy(0, 4, 8, 12))[("ns", "a")]
    assert d.admit
    racks = [s[RACK] for s in d.selectors]
    assert all(racks[i] == racks[i + 1] for i in range(0, 6, 2))
    assert len(set(racks)) == 3


def test_a_gang_read_back_from_its_pods_keeps_its_placement() -> None:
    pod = {
        "metadata": {
            "name": "a-0",
            "namespace": "ns",
            "labels": {"torchyard.dev/run": "a"},
            "annotations": {"torchyard.dev/placement": REQUIRED.to_json()},
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {
            "schedulingGates": [{"name": "torchyard.dev/gang"}],
            "nodeSelector": {"torchyard.dev/pool": "tas"},
            "containers": [{"resources": {"requests": {"nvidia.com/gpu": "8"}}}],
        },
    }
    (found,) = admission.waiting_gangs([pod])
    assert found.placement == REQUIRED
    plain = dataclasses.replace(found, placement=None)
    assert plain.shape != found.shape  # placed alike only with the same placement
