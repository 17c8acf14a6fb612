"""Gang admission's first fit scans the nodes once per gang, not once per Pod.

A 256-node gang on a 256-node pool was 65,536 node checks in ``place`` before its Pods
were created, and as many again in every pass while its admitted Pods waited to be
bound (benchmarks/fanout.py's profile); the placements must stay exactly first fit."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest

from torchyard.planning import admission

TOL = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
TAINT = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]


def nodes(count: int, gpus: list[int] | None = None) -> list[admission.Node]:
    return [
        admission.Node(
            f"n{i:03d}",
            {"torchyard.dev/pool": "gpu" if i % 7 else "other"},
            TAINT,
            {"nvidia.com/gpu": Decimal(gpus[i] if gpus else 8), "pods": Decimal(110)},
        )
        for i in range(count)
    ]


def gang(size: int, gpus: int) -> admission.Gang:
    return admission.Gang(
        key=("ns", "run"),
        created="2026-01-01T00:00:00Z",
        size=size,
        request={"nvidia.com/gpu": Decimal(gpus), "pods": Decimal(1)},
        selector={"torchyard.dev/pool": "gpu"},
        tolerations=TOL,
        pool="gpu",
    )


def first_fit(g: admission.Gang, pool: list[admission.Node]) -> list[str]:
    """The reference: each Pod on the first node, from the start, that takes it."""
    where = []
    for _ in range(g.size):
        for node in pool:
            if admission.eligible(node, g.selector, g.tolerations) and node.fits(dict(g.request)):
                node.take(dict(g.request))
                where.append(node.name)
                break
        else:
            break
    return where


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times ``eligible`` is asked (one node check each)."""
    count = [0]
    real = admission.eligible

    def counted(*args: object, **kwargs: object) -> bool:
        count[0] += 1
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(admission, "eligible", counted)
    return count


def test_placing_a_256_node_gang_checks_each_node_about_once(checks: list[int]) -> None:
    pool = nodes(300)
    fitting = [n for n in pool if n.labels["torchyard.dev/pool"] == "gpu"]
    assert admission.place(gang(len(fitting), 8), pool) == len(fitting)
    assert all(n.free["nvidia.com/gpu"] == 0 for n in fitting)
    assert checks[0] <= len(pool) + len(fitting)  # was len(pool) * len(fitting) / 2


@pytest.mark.parametrize("seed", range(20))
def test_placing_stays_first_fit(seed: int) -> None:
    rng = random.Random(seed)
    free = [rng.choice([0, 1, 2, 4, 8]) for _ in range(40)]
    g = gang(rng.randint(1, 60), rng.choice([1, 2, 4, 8]))
    reference = nodes(40, free)
    expected = first_fit(g, reference)
    pool = nodes(40, free)
    assert admission.place(g, pool) == len(expected)
    assert [n.free for n in pool] == [n.free for n in reference]


def admitted_unbound(i: int, gpus: int) -> dict[str, object]:
    return {
        "metadata": {"name": f"run-{i}"},
        "spec": {
            "nodeSelector": {"torchyard.dev/pool": "gpu"},
            "tolerations": TOL,
            "containers": [{"resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": "Pending"},
    }


def node_manifest(node: admission.Node) -> dict[str, object]:
    return {
        "metadata": {"name": node.name, "labels": node.labels},
        "spec": {"taints": node.taints},
        "status": {
            "allocatable": {k: str(v) for k, v in node.free.items()},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_a_pass_reserves_admitted_unbound_pods_in_one_scan(checks: list[int]) -> None:
    """A pass while a 256-Pod gang waits to be bound: its room is reserved first (first
    fit, one scan for Pods of one shape), so a gang behind it that needs a node is blocked."""
    pool = nodes(300)
    fitting = [n for n in pool if n.labels["torchyard.dev/pool"] == "gpu"]
    pods = [admitted_unbound(i, 8) for i in range(len(fitting))]
    decisions = admission.decide([gang(1, 8)], [node_manifest(n) for n in pool], pods)
    assert not decisions[("ns", "run")].admit
    assert checks[0] <= 3 * len(pool) + 2 * len(fitting)  # was len(pool) * len(fitting) / 2
