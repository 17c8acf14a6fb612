"""Gang admission's queue bookkeeping: which Pods make a waiting gang and since when, what
each waiting gang is told (its place, who it waits behind, why it can never fit), the
queue beyond its first 50 places, and the room that admitted Pods not yet bound hold."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from torchyard.planning import admission

POOL = "torchyard.dev/pool"
RUN = "torchyard.dev/run"
QUEUED_AT = "torchyard.dev/queued-at"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GPU_TOL = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def node(name: str, pool: str = "a100", gpus: int = 8) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {POOL: pool}},
        "spec": {"taints": [GPU_TAINT]},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus), "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod(
    run: str | None,
    *,
    gated: bool = True,
    created: str = "2026-01-01T00:00:00Z",
    pool: str | None = "a100",
    gpus: int = 8,
    **extra: Any,
) -> dict[str, Any]:
    """A node Pod of ``run`` (its labels, gate, requests) as the operator makes it."""
    spec: dict[str, Any] = {
        "containers": [{"resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}],
        "tolerations": GPU_TOL,
    }
    if pool is not None:
        spec["nodeSelector"] = {POOL: pool}
    if gated:
        spec["schedulingGates"] = [{"name": admission.GANG_GATE}]
    meta: dict[str, Any] = {"namespace": "ns", "creationTimestamp": created}
    if run is not None:
        meta["labels"] = {RUN: run}
    for key, value in extra.items():
        (meta if key in ("annotations", "deletionTimestamp") else spec)[key] = value
    return {"metadata": meta, "spec": spec, "status": {"phase": "Pending"}}


def not_on(*names: str) -> dict[str, Any]:
    """The required node affinity that keeps a run off its bad nodes."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": names}]}
    terms = {"nodeSelectorTerms": [term]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": terms}}


# Which Pods make a waiting gang, and since when


def test_a_waiting_gang_is_a_runs_gated_pods_that_are_not_being_deleted() -> None:
    pods = [
        pod("a", created="2026-01-01T00:00:03Z"),
        pod("a", created="2026-01-01T00:00:01Z"),
        pod("a", created="2026-01-01T00:00:02Z", deletionTimestamp="2026-01-01T00:01:00Z"),
        pod("b", gated=False),  # admitted already
        pod(None),  # no run's Pod
    ]
    [gang] = admission.waiting_gangs(pods)
    assert gang == admission.Gang(
        key=("ns", "a"),
        created="2026-01-01T00:00:01Z",  # its oldest Pod's
        size=2,
        request={"nvidia.com/gpu": Decimal(8), "pods": Decimal(1)},
        selector={POOL: "a100"},
        tolerations=GPU_TOL,
        pool="a100",
    )


def test_a_gang_waits_since_its_queued_at_time_when_its_oldest_pod_has_one() -> None:
    """A gang restarted keeps its place in the queue (the time it first queued)."""
    pods = [
        pod("a", created="2026-01-01T00:05:00Z", annotations={QUEUED_AT: "2026-01-01T00:00:00Z"}),
        pod("a", created="2026-01-01T00:06:00Z", annotations={QUEUED_AT: "2026-01-01T00:09:00Z"}),
    ]
    assert [g.created for g in admission.waiting_gangs(pods)] == ["2026-01-01T00:00:00Z"]


def test_a_gang_is_its_pods_requests_pool_priority_and_the_nodes_it_must_avoid() -> None:
    pods = [pod("a", priority=1000, affinity=not_on("a100-3"))]
    [gang] = admission.waiting_gangs(pods)
    assert (gang.priority, gang.excluded, gang.pool) == (1000, frozenset({"a100-3"}), "a100")


def test_a_pod_that_leaves_out_selector_tolerations_priority_and_times_reads_as_empty() -> None:
    bare = pod("a", pool=None)
    del bare["spec"]["tolerations"], bare["metadata"]["creationTimestamp"]
    [gang] = admission.waiting_gangs([bare])
    assert (gang.created, gang.selector, gang.tolerations, gang.pool, gang.priority) == (
        "",
        {},
        [],
        "",
        0,
    )


# What each waiting gang is told


def gang(name: str, size: int, gpus: int = 8, pool: str = "a100", **extra: Any) -> admission.Gang:
    request = {"nvidia.com/gpu": Decimal(gpus), "pods": Decimal(1)} if gpus else {}
    return admission.Gang(
        key=("ns", name),
        created=extra.pop("created", f"2026-01-01T00:00:{name[-2:]}Z"),
        size=size,
        request={**request, "pods": Decimal(1)},
        selector={POOL: pool} if pool else {},
        tolerations=GPU_TOL,
        pool=pool,
        **extra,
    )


NODES = [node(f"a100-{i}") for i in range(4)] + [node("cpu-0", pool="cpu")]


def busy(node_name: str, gpus: int = 8) -> dict[str, Any]:
    return {
        "metadata": {"name": f"busy-{node_name}", "namespace": "other"},
        "spec": {
            "nodeName": node_name,
            "containers": [{"resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": "Running"},
    }


def test_the_head_that_does_not_fit_blocks_and_those_behind_say_whom_they_wait_for() -> None:
    decided = admission.decide(
        [gang("g00", 3), gang("g01", 1), gang("g02", 2, pool="")],
        NODES,
        [busy("a100-0"), busy("a100-1")],
    )
    assert decided[("ns", "g00")] == admission.Decision(
        False,
        2,
        "needs 3 node(s) with 8 nvidia.com/gpu in pool a100; 2 fit now",
        position=1,
        blocking=True,
    )
    assert decided[("ns", "g01")] == admission.Decision(
        False,
        1,
        "needs 1 node(s) with 8 nvidia.com/gpu in pool a100; 1 fit now; waiting behind "
        "ns/g00 (first come, first served)",
        position=2,
    )
    # no pool: any node with room (a queue of its own), and what it needs says no pool
    assert decided[("ns", "g02")] == admission.Decision(
        True, 2, "2 node(s) with 8 nvidia.com/gpu: all fit"
    )


def test_a_gang_that_asks_for_no_gpu_is_told_so_without_a_gpu_count() -> None:
    decided = admission.decide([gang("g00", 2, gpus=0, pool="cpu")], NODES, [])
    assert decided[("ns", "g00")] == admission.Decision(True, 2, "2 node(s) in pool cpu: all fit")


def test_a_gang_no_node_can_take_is_told_why_and_blocks_nobody() -> None:
    decided = admission.decide(
        [gang("g00", 1, pool="h100"), gang("g01", 5), gang("g02", 1)], NODES, []
    )
    assert decided[("ns", "g00")] == admission.Decision(
        False,
        0,
        "needs 1 node(s) with 8 nvidia.com/gpu in pool h100; no Ready node matches the "
        "pool's selector and tolerations",
        position=1,
    )
    assert decided[("ns", "g01")] == admission.Decision(
        False,
        0,
        "needs 5 node(s) with 8 nvidia.com/gpu in pool a100; the pool cannot hold it even "
        "when idle (4 matching node(s))",
        position=1,
    )
    assert decided[("ns", "g02")].admit


def test_nodes_left_out_as_bad_for_a_run_are_no_room_for_it_and_are_counted_apart() -> None:
    avoid = frozenset({"a100-1", "a100-2"})
    decided = admission.decide([gang("g00", 3, excluded=avoid)], NODES, [])
    assert decided[("ns", "g00")] == admission.Decision(
        False,
        0,
        "needs 3 node(s) with 8 nvidia.com/gpu in pool a100; the pool cannot hold it even "
        "when idle (2 matching node(s); 2 more left out as bad for this run "
        "(status.excludedNodes))",
        position=1,
    )
    decided = admission.decide([gang("g00", 2, excluded=avoid)], NODES, [busy("a100-0")])
    assert decided[("ns", "g00")] == admission.Decision(
        False, 1, "needs 2 node(s) with 8 nvidia.com/gpu in pool a100; 1 fit now", 1, True
    )


# The queue beyond its first 50 places


def test_beyond_the_first_50_places_a_gang_is_told_a_message_that_does_not_move() -> None:
    assert admission.EXACT_POSITIONS == 50
    waiting = [gang(f"g{i:02d}", 4 if i == 0 else 1) for i in range(53)]
    waiting.append(gang("other-pool-00", 1, pool="cpu", gpus=0))
    decided = admission.decide(waiting, NODES, [busy("a100-0")])
    assert decided[("ns", "g00")].blocking and decided[("ns", "g00")].position == 1
    assert [decided[("ns", f"g{i:02d}")].position for i in range(1, 53)] == [
        *range(2, 51),
        0,
        0,
        0,
    ]
    assert decided[("ns", "g49")].message.endswith(
        "waiting behind ns/g00 (first come, first served)"
    )
    beyond = admission.Decision(
        False,
        0,
        "needs 1 node(s) with 8 nvidia.com/gpu in pool a100; more than 50 runs ahead of it "
        "in its pool's queue (first come, first served)",
    )
    assert [decided[("ns", f"g{i:02d}")] for i in (50, 51, 52)] == [beyond] * 3
    assert decided[("ns", "other-pool-00")].admit  # another pool's queue


# The room that admitted Pods not bound yet hold


def test_admitted_pods_not_yet_bound_hold_room_first_fit_and_the_rest_do_not() -> None:
    nodes = [node(f"a100-{i}") for i in range(3)]
    pods = [
        pod("x", gated=False, created="2026-01-01T00:00:00Z"),  # admitted, not bound: a100-0
        pod("y", gated=False, affinity=not_on("a100-0", "a100-1")),  # off its bad nodes: a100-2
        pod("z", gated=True),  # still waiting: holds nothing
        {**pod("w", gated=False), "status": {"phase": "Failed"}},  # ended before binding
        busy("a100-1"),  # bound: counted where it is, once
    ]
    decided = admission.decide([gang("g00", 1), gang("g01", 1)], nodes, pods)
    assert not decided[("ns", "g00")].admit
    assert decided[("ns", "g00")].fit_now == 0
    assert admission.decide([gang("g00", 1)], nodes, pods[:1] + pods[2:])[("ns", "g00")].admit


def test_admitted_pods_of_every_shape_are_placed_from_the_first_node_they_fit() -> None:
    """Pods of one shape resume where the last went; another shape starts over."""
    nodes = [node("a100-0", gpus=8), node("a100-1", gpus=8), node("cpu-0", pool="cpu")]
    pods = [
        pod("x", gated=False, pool="cpu", gpus=0),
        pod("y", gated=False, gpus=4),
        pod("y", gated=False, gpus=4),
        pod("y", gated=False, gpus=4),
        pod("p", gated=False, pool=None, gpus=4),  # any node: a100-1's last 4 GPUs
    ]
    decided = admission.decide([gang("g00", 1, gpus=4)], nodes, pods)
    assert decided[("ns", "g00")] == admission.Decision(
        False,
        0,
        "needs 1 node(s) with 4 nvidia.com/gpu in pool a100; 0 fit now",
        position=1,
        blocking=True,
    )
    assert admission.decide([gang("g00", 1, gpus=4)], nodes, pods[:4])[("ns", "g00")].admit


def test_a_pod_without_a_spec_holds_one_pod_slot_of_the_first_node() -> None:
    nodes = [{**node("a100-0"), "spec": {}}]  # untainted
    nodes[0]["status"]["allocatable"]["pods"] = "1"
    decided = admission.decide([gang("g00", 1)], nodes, [{"metadata": {"name": "bare"}}])
    assert not decided[("ns", "g00")].admit


@pytest.mark.parametrize("pending", [1, 2])
def test_a_gang_that_fits_once_the_pods_before_it_are_placed_is_admitted(pending: int) -> None:
    nodes = [node(f"a100-{i}") for i in range(3)]
    pods = [pod("x", gated=False) for _ in range(pending)]
    decided = admission.decide([gang("g00", 3 - pending)], nodes, pods)
    assert decided[("ns", "g00")] == admission.Decision(
        True, 3 - pending, f"{3 - pending} node(s) with 8 nvidia.com/gpu in pool a100: all fit"
    )


def test_a_bound_pod_holds_room_only_where_it_is_bound() -> None:
    nodes = [node("a100-0"), node("a100-1")]
    bound = pod("b", gated=False, nodeName="a100-1")
    assert admission.decide([gang("g00", 1)], nodes, [bound])[("ns", "g00")].admit


def test_an_admitted_pod_holds_room_off_its_own_bad_nodes() -> None:
    """It will be bound on a100-1 (its run avoids a100-0): a100-0 stays free for a gang
    that avoids a100-1."""
    nodes = [node("a100-0"), node("a100-1")]
    admitted = pod("y", gated=False, affinity=not_on("a100-0"))
    waiting = gang("g00", 1, excluded=frozenset({"a100-1"}))
    assert admission.decide([waiting], nodes, [admitted])[("ns", "g00")].admit
