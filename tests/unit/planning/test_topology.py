"""Where a gang goes in the network (``planning.topology``): the fewest domains, best fit,
ranks domain by domain, and the words of a gang that waits."""

from __future__ import annotations

import pytest

from torchyard.api.placement import Placement
from torchyard.planning import topology
from torchyard.planning.topology import Request

BLOCK, RACK = "example.com/block", "example.com/rack"
RACKS = Request((BLOCK, RACK), "required")


def placement(level: str, mode: str = "required", slice_size: int | None = None) -> Placement:
    body: dict[str, object] = {"topology": {"level": level, "mode": mode}}
    if slice_size is not None:
        body["sliceSize"] = slice_size
    return Placement.model_validate(body)


def kueue_topology(name: str, *levels: str) -> dict[str, object]:
    return {
        "metadata": {"name": name},
        "spec": {"levels": [{"nodeLabel": level} for level in levels]},
    }


def test_the_levels_above_come_from_the_kueue_topology_that_has_the_level() -> None:
    topologies = [
        kueue_topology("zones", "topology.kubernetes.io/zone", "kubernetes.io/hostname"),
        kueue_topology("racks", BLOCK, RACK, "kubernetes.io/hostname"),
    ]
    req = topology.request(placement(RACK), topologies)
    assert req == Request((BLOCK, RACK), "required", None)
    assert req.level == RACK


def test_without_a_kueue_topology_the_level_stands_alone() -> None:
    assert topology.request(placement(RACK, "preferred")) == Request((RACK,), "preferred")


def test_a_request_travels_on_a_pod_and_back() -> None:
    req = Request((BLOCK, RACK), "required", 4)
    assert Request.from_json(req.to_json()) == req
    for broken in ("", "{", '{"levels": []}', '{"levels": ["a"], "mode": "maybe"}', "[1]"):
        assert Request.from_json(broken) is None


def test_a_node_without_the_level_is_in_no_domain() -> None:
    assert topology.domain_of({RACK: "r1", BLOCK: "b1"}, (BLOCK, RACK)) == ("b1", "r1")
    assert topology.domain_of({RACK: "r1"}, (BLOCK, RACK)) == ("", "r1")
    assert topology.domain_of({BLOCK: "b1"}, (BLOCK, RACK)) is None
    assert topology.selector((BLOCK, RACK), ("", "r1")) == {RACK: "r1"}


ROOM = {("b1", "r1"): 5, ("b1", "r2"): 8, ("b2", "r3"): 3, ("b2", "r4"): 4}


@pytest.mark.parametrize(
    ("req", "size", "room", "domains"),
    [
        # required: the fullest domain that still holds it (best fit)
        (RACKS, 4, ROOM, ((("b2", "r4"), 4),)),
        (RACKS, 5, ROOM, ((("b1", "r1"), 5),)),
        (RACKS, 8, ROOM, ((("b1", "r2"), 8),)),
        # preferred, one domain holds it: as required
        (Request((BLOCK, RACK), "preferred"), 3, ROOM, ((("b2", "r3"), 3),)),
        # preferred over racks, inside one block: both blocks hold 6 in two racks, block
        # 2 with less room left over
        (
            Request((BLOCK, RACK), "preferred"),
            6,
            {("b1", "r1"): 4, ("b1", "r2"): 4, ("b2", "r3"): 3, ("b2", "r4"): 4},
            ((("b2", "r3"), 2), (("b2", "r4"), 4)),
        ),
        # 9: no rack holds it, only block 1 does
        (Request((BLOCK, RACK), "preferred"), 9, ROOM, ((("b1", "r1"), 1), (("b1", "r2"), 8))),
        # 10: only block 1 holds it in two racks
        (Request((BLOCK, RACK), "preferred"), 10, ROOM, ((("b1", "r1"), 2), (("b1", "r2"), 8))),
        # 18: more than any block: the biggest racks first, the last one the smallest fit
        (
            Request((BLOCK, RACK), "preferred"),
            18,
            ROOM,
            ((("b1", "r1"), 5), (("b1", "r2"), 8), (("b2", "r3"), 1), (("b2", "r4"), 4)),
        ),
        # slices of 2: each in one rack; 4 slices, rack r2 holds 4 of them
        (Request((BLOCK, RACK), "required", 2), 8, ROOM, ((("b1", "r2"), 8),)),
        # slices of 4: r2 holds 2, r1 1, r4 1 -> 3 slices need two racks of block 1
        (Request((BLOCK, RACK), "required", 4), 12, ROOM, ((("b1", "r1"), 4), (("b1", "r2"), 8))),
    ],
)
def test_the_fewest_domains_hold_the_gang(
    req: Request, size: int, room: dict[topology.Domain, int], domains: tuple[object, ...]
) -> None:
    packing = topology.pack(req, size, room)
    assert packing.placed == size
    assert packing.domains == domains
    assert sum(count for _, count in packing.domains) == size


def test_a_required_gang_no_domain_holds_waits_and_says_the_largest() -> None:
    packing = topology.pack(RACKS, 9, ROOM)
    assert packing.domains == ()
    assert packing.largest == 8
    assert topology.wait_message(RACKS, 9, packing, "9 node(s)") == (
        "needs 9 node(s) in one example.com/rack; the largest free example.com/rack has 8"
    )


def test_slices_that_do_not_fit_count_whole_slices_only() -> None:
    req = Request((RACK,), "required", 4)
    packing = topology.pack(req, 12, {("r1",): 7, ("r2",): 3, ("r3",): 4})
    assert packing.domains == ()
    assert packing.placed == 8  # r1 holds one slice of 4 (not 7/4), r3 one
    assert topology.wait_message(req, 12, packing, "12 node(s)") == (
        "needs 12 node(s) in slices of 4, each in one example.com/rack; 2 of 3 slice(s) fit now"
    )


def test_a_preferred_gang_that_does_not_fit_says_how_many_do() -> None:
    req = Request((RACK,), "preferred")
    packing = topology.pack(req, 10, {("r1",): 3, ("r2",): 4})
    assert (packing.domains, packing.placed) == ((), 7)
    assert topology.wait_message(req, 10, packing, "10 node(s)") == "needs 10 node(s); 7 fit now"


def test_ranks_follow_the_domains_in_order() -> None:
    domains = ((("b1", "r1"), 2), (("b1", "r2"), 3))
    assert topology.ranks(domains) == [("b1", "r1")] * 2 + [("b1", "r2")] * 3
    assert topology.describe(RACK, ["r1", "r1", "r2", "r2", "r2", "r9"]) == (
        " in example.com/rack r1 (node ranks 0-1), r2 (node ranks 2-4), r9 (node rank 5)"
    )
