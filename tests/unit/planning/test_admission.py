"""Gang admission: whole gangs only, first come first served per pool."""

from __future__ import annotations

import dataclasses
from decimal import Decimal

import pytest

from tests.cluster.harness import DEFAULT_POOLS, node_manifest
from torchyard.planning import admission

NODES = [node_manifest(pool, i) for pool in DEFAULT_POOLS for i in range(pool.nodes)]
for n in NODES:
    n["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
GPU_TOL = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def gang(
    name: str, size: int, gpus: int, created: str = "2026-01-01T00:00:00Z", pool: str = "a100"
) -> admission.Gang:
    return admission.Gang(
        key=("ns", name),
        created=created,
        size=size,
        request={"nvidia.com/gpu": Decimal(gpus), "pods": Decimal(1)},
        selector={"torchyard.dev/pool": pool},
        tolerations=GPU_TOL,
        pool=pool,
    )


def busy_pod(node: str, gpus: int) -> dict[str, object]:
    return {
        "metadata": {"name": f"busy-{node}"},
        "spec": {
            "nodeName": node,
            "containers": [{"resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": "Running"},
    }


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Decimal("0.5")),
        ("64Gi", Decimal(64 * 2**30)),
        ("8", Decimal(8)),
        ("1e3", Decimal(1000)),
        ("1k", Decimal(1000)),
    ],
)
def test_quantities(text: str, value: Decimal) -> None:
    assert admission.quantity(text) == value


def test_a_gang_that_fits_is_admitted_whole() -> None:
    d = admission.decide([gang("a", 4, 8)], NODES, [])
    assert d[("ns", "a")].admit and d[("ns", "a")].fit_now == 4


def test_a_gang_that_does_not_fit_waits_with_numbers() -> None:
    pods = [busy_pod("a100-0", 8), busy_pod("a100-1", 8)]
    d = admission.decide([gang("a", 4, 8)], NODES, pods)[("ns", "a")]
    assert not d.admit
    assert d.message == "needs 4 node(s) with 8 nvidia.com/gpu in pool a100; 2 fit now"


def test_first_come_first_served_blocks_younger_runs_of_the_pool() -> None:
    pods = [busy_pod("a100-0", 8)]
    d = admission.decide(
        [gang("big", 4, 8, "2026-01-01T00:00:00Z"), gang("small", 1, 8, "2026-01-01T00:00:05Z")],
        NODES,
        pods,
    )
    assert not d[("ns", "big")].admit
    assert not d[("ns", "small")].admit
    assert "waiting behind ns/big" in d[("ns", "small")].message


def test_two_gangs_that_fit_alone_but_not_together() -> None:
    d = admission.decide(
        [gang("one", 3, 8, "2026-01-01T00:00:00Z"), gang("two", 3, 8, "2026-01-01T00:00:01Z")],
        NODES,
        [],
    )
    assert d[("ns", "one")].admit and not d[("ns", "two")].admit


def test_unknown_pool_and_impossible_gangs_do_not_block_others() -> None:
    d = admission.decide(
        [
            gang("nowhere", 1, 1, "2026-01-01T00:00:00Z", pool="h100"),
            gang("huge", 1, 16, "2026-01-01T00:00:01Z"),
            gang("ok", 2, 4, "2026-01-01T00:00:02Z"),
        ],
        NODES,
        [],
    )
    assert "no Ready node matches" in d[("ns", "nowhere")].message
    assert "cannot hold it even when idle" in d[("ns", "huge")].message
    assert d[("ns", "ok")].admit


@pytest.mark.parametrize("key", ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"])
def test_a_ready_node_still_tainted_down_is_not_offered_even_to_pods_that_tolerate_it(
    key: str,
) -> None:
    """The node lifecycle controller lifts the taint a while after the node is Ready;
    every Pod tolerates it for 300 s (DefaultTolerationSeconds), yet a gang put there
    would be failed at once as on a node that is down."""
    a100 = [n for n in NODES if n["metadata"]["labels"]["torchyard.dev/pool"] == "a100"]
    tainted = {**a100[0], "spec": {"taints": [{"key": key, "effect": "NoExecute"}]}}
    default = {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
    tolerant = dataclasses.replace(gang("all", len(a100), 8), tolerations=[*GPU_TOL, default])
    d = admission.decide([tolerant], [tainted, *a100[1:]], [])
    assert not d[("ns", "all")].admit
    assert "cannot hold it even when idle" in d[("ns", "all")].message
    d = admission.decide([tolerant], a100, [])
    assert d[("ns", "all")].admit


def test_gpu_pool_is_tainted_for_pods_without_toleration() -> None:
    g = admission.Gang(
        key=("ns", "cpu-job"),
        created="",
        size=1,
        request={"pods": Decimal(1)},
        selector={"torchyard.dev/pool": "a100"},
        tolerations=(),
    )
    assert not admission.decide([g], NODES, [])[("ns", "cpu-job")].admit


def test_a_higher_priority_goes_first_and_the_rest_are_numbered_per_pool() -> None:
    urgent = admission.Gang(
        **{**gang("urgent", 4, 8, created="2026-01-01T00:09:00Z").__dict__, "priority": 100}
    )
    waiting = [
        gang("old", 4, 8, created="2026-01-01T00:00:00Z"),
        gang("young", 4, 8, created="2026-01-01T00:05:00Z"),
        urgent,
        gang("elsewhere", 1, 8, pool="nope"),
    ]
    busy = [busy_pod(n["metadata"]["name"], 4) for n in NODES if "a100" in n["metadata"]["name"]]
    d = admission.decide(waiting, NODES, busy)
    assert [g.key[1] for g in admission.order(waiting)][:3] == ["urgent", "elsewhere", "old"]
    assert {k[1]: v.position for k, v in d.items()} == {
        "urgent": 1,
        "old": 2,
        "young": 3,
        "elsewhere": 1,
    }
    assert "waiting behind ns/urgent" in d[("ns", "old")].message
