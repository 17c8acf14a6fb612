"""The admission pass over the watch-fed cache: one queue per pool, served by priority
then age, whole gangs only, first come first served, admitted when capacity changes,
positions that move only when they change; and what a reconcile makes of it."""

from __future__ import annotations

import logging
from typing import Any

from tests.unit.controller.fake_k8s import FakeK8s
from tests.unit.controller.world import (
    NS,
    POOL,
    env,
    gpu_node,
    node_pod,
    reconcile,
    run,
    status,
    world,
)
from torchyard import k8s
from torchyard.controller import admission, context, trainingruns
from torchyard.planning import pods

GPU_TOL = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def gang_pod(
    run_name: str,
    node: int,
    *,
    gpus: int = 8,
    queued_at: str = "2026-01-01T10:00:00Z",
    priority: int = 0,
    gated: bool = True,
    node_name: str | None = None,
    phase: str = "Pending",
    version: int = 1,
) -> dict[str, Any]:
    """Node Pod ``node`` of run ``run_name`` as the watch delivers it."""
    spec: dict[str, Any] = {
        "nodeSelector": {pods.POOL_LABEL: POOL},
        "tolerations": GPU_TOL,
        "priority": priority,
        "containers": [{"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
    }
    if gated:
        spec["schedulingGates"] = [{"name": pods.GANG_GATE}]
    if node_name:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{run_name}-{node}",
            "namespace": NS,
            "labels": {"torchyard.dev/run": run_name},
            "annotations": {pods.QUEUED_AT_ANNOTATION: queued_at},
            "creationTimestamp": queued_at,
            "resourceVersion": str(version),
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def gang(run_name: str, size: int, **kw: Any) -> list[dict[str, Any]]:
    return [gang_pod(run_name, i, **kw) for i in range(size)]


def primed(*objects: dict[str, Any]) -> context.Context:
    """A Context whose cache holds ``objects`` (Nodes and Pods), as after start-up."""
    fake = FakeK8s(*objects)
    ctx = context.Context(k8s=fake)
    admission.prime(ctx)
    return ctx


def keys(*names: str) -> list[tuple[str, str, str]]:
    return [("TrainingRun", NS, n) for n in names]


def places(ctx: context.Context) -> dict[str, tuple[str, int]]:
    return {k[1]: (p.pool, p.position) for k, p in ctx.cache.places.items()}


def test_nothing_is_admitted_before_the_cache_is_primed() -> None:
    ctx = context.Context(k8s=FakeK8s())
    ctx.cache.node_event("ADDED", gpu_node("gpu-0"))
    for p in gang("a", 1):
        ctx.cache.pod_event("ADDED", p)
    assert admission.run_pass(ctx).keys == []
    assert ctx.cache.admitted == set()


def test_a_pool_is_served_by_priority_then_age_and_numbered() -> None:
    ctx = primed(
        gpu_node("gpu-0"),
        *gang("old", 1, queued_at="2026-01-01T10:00:00Z"),
        *gang("young", 1, queued_at="2026-01-01T10:05:00Z"),
        *gang("urgent", 1, queued_at="2026-01-01T10:09:00Z", priority=1000),
    )
    assert sorted(admission.run_pass(ctx).keys) == keys("old", "urgent", "young")
    assert ctx.cache.admitted == {(NS, "urgent")}
    assert places(ctx) == {"old": (POOL, 1), "young": (POOL, 2)}


def test_first_come_first_served_a_small_gang_waits_behind_a_big_one() -> None:
    ctx = primed(
        gpu_node("gpu-0"),
        gpu_node("gpu-1"),
        *gang("busy", 1, gated=False, node_name="gpu-0", phase="Running"),
        *gang("big", 2, queued_at="2026-01-01T10:00:00Z"),
        *gang("small", 1, queued_at="2026-01-01T10:01:00Z"),
    )
    admission.run_pass(ctx)
    assert ctx.cache.admitted == set()
    assert places(ctx) == {"big": (POOL, 1), "small": (POOL, 2)}
    assert "waiting behind ns/big" in ctx.cache.places[(NS, "small")].message


def test_an_admitted_gang_holds_its_room_so_no_two_partial_gangs_share_a_pool() -> None:
    nodes = [gpu_node(f"gpu-{i}") for i in range(4)]
    ctx = primed(*nodes, *gang("left", 3), *gang("right", 3, queued_at="2026-01-01T10:01:00Z"))
    assert sorted(admission.run_pass(ctx).keys) == keys("left", "right")
    assert ctx.cache.admitted == {(NS, "left")}
    # Another event, another pass: "left" is not bound yet, but its room is taken.
    ctx.cache.node_event(
        "MODIFIED",
        {
            **gpu_node("gpu-3"),
            "metadata": {
                **gpu_node("gpu-3")["metadata"],
                "labels": {pods.POOL_LABEL: POOL, "x": "y"},
            },
        },
    )
    assert admission.run_pass(ctx).keys == []
    assert ctx.cache.admitted == {(NS, "left")}
    assert places(ctx) == {"right": (POOL, 1)}


def test_a_freed_slot_admits_the_next_gang_on_the_pod_event_alone() -> None:
    ctx = primed(
        gpu_node("gpu-0"),
        *gang("first", 1, gated=False, node_name="gpu-0", phase="Running"),
        *gang("second", 1),
        *gang("third", 1, queued_at="2026-01-01T10:01:00Z"),
    )
    admission.run_pass(ctx)
    assert places(ctx) == {"second": (POOL, 1), "third": (POOL, 2)}
    assert admission.run_pass(ctx).keys == []  # nothing changed: no pass, nobody queued
    done = gang_pod("first", 0, gated=False, node_name="gpu-0", phase="Succeeded", version=2)
    assert ctx.cache.pod_event("MODIFIED", done)
    # "second" is admitted, "third" moves up: both are queued, nobody else.
    passed = admission.run_pass(ctx)
    assert (passed.admitted, passed.moved) == (keys("second"), keys("third"))
    assert ctx.cache.admitted == {(NS, "second")}
    assert places(ctx) == {"third": (POOL, 1)}


def test_a_node_that_becomes_not_ready_takes_its_room_away_and_back() -> None:
    ctx = primed(gpu_node("gpu-0"), gpu_node("gpu-1"))
    down = gpu_node("gpu-1")
    down["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    assert ctx.cache.node_event("MODIFIED", down)
    for p in gang("pair", 2):
        ctx.cache.pod_event("ADDED", p)
    assert admission.run_pass(ctx).keys == keys("pair")  # queued, with its reason
    assert ctx.cache.admitted == set()
    assert "the pool cannot hold it even when idle (1 matching node(s))" in (
        ctx.cache.places[(NS, "pair")].message
    )
    assert ctx.cache.node_event("MODIFIED", gpu_node("gpu-1"))
    assert admission.run_pass(ctx).keys == keys("pair")
    assert ctx.cache.admitted == {(NS, "pair")}


def test_a_gang_admitted_by_a_pass_has_its_gates_lifted_by_its_reconcile() -> None:
    fake = world(run(status={"phase": "Queued", "restarts": 0}), env())
    fake.put(gpu_node("gpu-0"))
    fake.put(gpu_node("gpu-1"))
    for i in range(2):
        fake.put(node_pod(i, gated=True))
    reconcile(fake)  # world.reconcile: the pass the events made, then the reconcile
    assert all("schedulingGates" not in p["spec"] for p in fake.pods())
    assert status(fake)["phase"] == "Queued"
    assert "queue" not in status(fake)


def test_a_queued_run_shows_its_pool_and_position_in_its_status() -> None:
    fake = world(run(), env(), gpu_node("gpu-0", gpus=4))
    reconcile(fake)
    assert status(fake)["queue"] == {"pool": POOL, "position": 1}
    assert all(pods.GANG_GATE in str(p["spec"].get("schedulingGates")) for p in fake.pods())
    fake.reset_writes()
    reconcile(fake)  # the same place: no status write
    assert fake.statuses == []


def long_queue(waiting: int) -> list[dict[str, Any]]:
    """Two busy 8-GPU nodes and ``waiting`` one-node 8-GPU gangs queued a second apart."""
    return [
        gpu_node("gpu-0"),
        gpu_node("gpu-1"),
        *gang("busy0", 1, gated=False, node_name="gpu-0", phase="Running"),
        *[gang_pod("busy1", 0, gated=False, node_name="gpu-1", phase="Running")],
        *[
            p
            for i in range(waiting)
            for p in gang(f"w{i:03d}", 1, queued_at=f"2026-01-01T10:{i // 60:02d}:{i % 60:02d}Z")
        ],
    ]


def test_only_the_head_of_a_long_queue_is_numbered_so_a_freed_slot_moves_at_most_50() -> None:
    ctx = primed(*long_queue(60))
    admission.run_pass(ctx)
    numbered = {k: pos for k, (_, pos) in places(ctx).items()}
    assert numbered == {f"w{i:03d}": (i + 1 if i < 50 else 0) for i in range(60)}
    far = ctx.cache.places[(NS, "w055")].message
    assert far == (
        "needs 1 node(s) with 8 nvidia.com/gpu in pool a100; more than 50 runs ahead of it "
        "in its pool's queue (first come, first served)"
    )
    done = gang_pod("busy0", 0, gated=False, node_name="gpu-0", phase="Succeeded", version=2)
    assert ctx.cache.pod_event("MODIFIED", done)
    passed = admission.run_pass(ctx)
    # w000 admitted; w001..w050 move up one place (w050 into the numbered head); the nine
    # behind them keep their place and message: no reconcile, no status write for them.
    assert passed.admitted == keys("w000")
    assert sorted(passed.moved) == keys(*[f"w{i:03d}" for i in range(1, 51)])
    assert ctx.cache.places[(NS, "w050")].position == 50
    assert ctx.cache.places[(NS, "w055")].message == far


def test_a_run_created_far_back_in_a_blocked_queue_is_placed_without_a_pass() -> None:
    fake = world(run(), env(), *long_queue(55))
    ctx = context.Context(k8s=fake)
    admission.prime(ctx)
    admission.run_pass(ctx)
    body = fake.get(k8s.TRAININGRUNS, NS, "r")
    trainingruns.reconcile(body, logging.getLogger("test"), ctx)
    assert status(fake)["phase"] == "Queued"
    assert status(fake)["queue"] == {"pool": POOL}  # further back than the exact positions
    mine = [p for p in fake.pods() if p["metadata"]["labels"].get("torchyard.dev/run") == "r"]
    assert len(mine) == 2
    assert all(pods.GANG_GATE in str(p["spec"].get("schedulingGates")) for p in mine)
    # Its creation asks for no pass, and a full pass decides the same: nobody moves.
    assert not ctx.cache.dirty
    assert admission.run_pass(ctx).keys == []
    assert admission.run_pass(ctx, force=True).keys == []
    assert ctx.cache.places[(NS, "r")].position == 0


def test_a_run_created_near_the_head_is_still_decided_by_a_pass() -> None:
    fake = world(run(), env(), *long_queue(3))
    ctx = context.Context(k8s=fake)
    admission.prime(ctx)
    admission.run_pass(ctx)
    body = fake.get(k8s.TRAININGRUNS, NS, "r")
    trainingruns.reconcile(body, logging.getLogger("test"), ctx)
    assert status(fake)["queue"] == {"pool": POOL, "position": 4}
    assert any("waiting behind ns/w000" in c["message"] for c in status(fake)["conditions"])


def test_a_queued_gang_gets_its_headless_service_only_when_admitted() -> None:
    # One node of 4 free GPUs: run r (2 x 4 GPUs) waits, its Pods gated, and no Service.
    fake = world(run(), env(), gpu_node("gpu-0", gpus=4))
    reconcile(fake)
    assert status(fake)["phase"] == "Queued"
    assert fake.pod_names() == ["r-0", "r-1"]
    assert [o["kind"] for o in fake.applied if o["kind"] == "Service"] == []
    assert not fake.get_or_none(k8s.SERVICES, NS, "r")
    # A second node: the next reconcile (after the pass) lifts the gates, Service first.
    fake.put(gpu_node("gpu-1", gpus=4))
    fake.reset_writes()
    reconcile(fake)
    kinds = [o["kind"] for o in fake.applied]
    assert kinds.count("Service") == 1 and kinds.index("Service") < kinds.index("Pod")
    assert fake.get(k8s.SERVICES, NS, "r")["spec"]["clusterIP"] == "None"
    assert all(not p["spec"].get("schedulingGates") for p in fake.pods())
