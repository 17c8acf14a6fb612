"""Gang admission without an external scheduler: does the whole gang fit its pool now?

A run's node Pods are created with a scheduling gate; the operator lifts the gates of
all of them together, only when every Pod can be placed at once on the nodes of its
pool (node selector, taints tolerated, free ``nvidia.com/gpu``, cpu, memory and Pod
slots, after the Pods already bound and those admitted but not yet bound). Runs wait in
one queue per pool, in :func:`order` (higher priority class value first, then first
come, first served): while the first waiting run of a pool does not fit, no run behind
it in that pool is admitted, so two half-admitted runs can never deadlock the pool and a
big run is never starved by small ones. Each decision carries the run's position in its
pool's queue.

Pure: ``decide`` takes the observed nodes and Pods and the waiting gangs (``waiting_gangs``
finds them among the Pods), and returns a decision per gang. Called by the controller's
admission pass (``controller.admission``) under one lock, over its watch-fed cache
(``controller.cache``). Tested in tests/unit/planning/test_admission.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from torchyard.api.quantities import quantity as quantity  # re-exported: one parser
from torchyard.planning.names import LABEL_RUN
from torchyard.planning.pods import GANG_GATE, GPU_RESOURCE, POOL_LABEL, QUEUED_AT_ANNOTATION

TRACKED = ("cpu", "memory", GPU_RESOURCE, "pods")

Resources = dict[str, Decimal]


def pod_requests(pod: Mapping[str, Any]) -> Resources:
    """What a Pod asks for: its containers' requests (limits where no request), one slot."""
    total: Resources = {"pods": Decimal(1)}
    for container in pod.get("spec", {}).get("containers", []):
        res = container.get("resources", {})
        asked = {**res.get("limits", {}), **res.get("requests", {})}
        for name in TRACKED:
            if name in asked:
                total[name] = total.get(name, Decimal(0)) + quantity(asked[name])
    return total


def _is_terminal(pod: Mapping[str, Any]) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")


def is_gated(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == GANG_GATE for g in pod.get("spec", {}).get("schedulingGates", []))


@dataclass
class Node:
    name: str
    labels: Mapping[str, str]
    taints: Sequence[Mapping[str, Any]]
    free: Resources

    def fits(self, req: Resources) -> bool:
        return all(self.free.get(k, Decimal(0)) >= v for k, v in req.items())

    def take(self, req: Resources) -> None:
        for k, v in req.items():
            self.free[k] = self.free.get(k, Decimal(0)) - v


def _ready(node: Mapping[str, Any]) -> bool:
    if node.get("spec", {}).get("unschedulable"):
        return False
    conds = node.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def free_nodes(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> list[Node]:
    """Ready nodes with their allocatable minus what bound, live Pods request."""
    out = {}
    for node in nodes:
        if not _ready(node):
            continue
        alloc = node.get("status", {}).get("allocatable", {})
        free = {k: quantity(alloc[k]) for k in TRACKED if k in alloc}
        name = node["metadata"]["name"]
        out[name] = Node(
            name, node["metadata"].get("labels", {}), node.get("spec", {}).get("taints", []), free
        )
    for pod in pods:
        bound = pod.get("spec", {}).get("nodeName")
        if bound in out and not _is_terminal(pod):
            out[bound].take(pod_requests(pod))
    return sorted(out.values(), key=lambda n: n.name)


def _tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    if taint.get("effect") == "PreferNoSchedule":
        return True
    for tol in tolerations:
        if tol.get("effect") and tol.get("effect") != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists":
            if not tol.get("key") or tol.get("key") == taint.get("key"):
                return True
        elif tol.get("key") == taint.get("key") and tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def eligible(
    node: Node, selector: Mapping[str, str], tolerations: Sequence[Mapping[str, Any]]
) -> bool:
    if any(node.labels.get(k) != v for k, v in selector.items()):
        return False
    return all(_tolerates(tolerations, t) for t in node.taints)


@dataclass(frozen=True)
class Gang:
    """A run waiting for admission: ``size`` identical Pods."""

    key: tuple[str, str]  # (namespace, name)
    created: str  # creationTimestamp: first come, first served
    size: int
    request: Mapping[str, Decimal]
    selector: Mapping[str, str]
    tolerations: Sequence[Mapping[str, Any]] = field(default_factory=tuple)
    pool: str = ""  # for messages
    priority: int = 0  # the Pods' priority (their PriorityClass's value): higher goes first

    @property
    def pool_key(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(self.selector.items()))


@dataclass(frozen=True)
class Decision:
    admit: bool
    fit_now: int
    message: str
    position: int = 0  # 1-based place in its pool's queue when not admitted; 0 when admitted


def order(waiting: Iterable[Gang]) -> list[Gang]:
    """The order in which a pool's gangs are served: priority value, then age."""
    return sorted(waiting, key=lambda g: (-g.priority, g.created, g.key))


def gang_of(key: tuple[str, str], created: str, size: int, pod: Mapping[str, Any]) -> Gang:
    """A gang of ``size`` Pods like ``pod``, waiting since ``created``."""
    spec = pod["spec"]
    return Gang(
        key=key,
        created=created,
        size=size,
        request=pod_requests(pod),
        selector=spec.get("nodeSelector", {}),
        tolerations=spec.get("tolerations", []),
        pool=spec.get("nodeSelector", {}).get(POOL_LABEL, ""),
        priority=int(spec.get("priority") or 0),
    )


def waiting_gangs(pods: Iterable[Mapping[str, Any]]) -> list[Gang]:
    """The runs whose Pods all still carry the gang gate (not being deleted)."""
    by_run: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for p in pods:
        meta = p["metadata"]
        run = meta.get("labels", {}).get(LABEL_RUN)
        if run and is_gated(p) and not meta.get("deletionTimestamp"):
            by_run.setdefault((meta["namespace"], run), []).append(p)
    found = []
    for key, members in by_run.items():
        first = min(members, key=lambda p: p["metadata"].get("creationTimestamp", ""))
        created = first["metadata"].get("creationTimestamp", "")
        queued_at = first["metadata"].get("annotations", {}).get(QUEUED_AT_ANNOTATION, created)
        found.append(gang_of(key, queued_at, len(members), first))
    return found


def describe_need(gang: Gang) -> str:
    gpus = gang.request.get(GPU_RESOURCE, Decimal(0))
    what = f"{gang.size} node(s)"
    if gpus:
        what += f" with {gpus:f} nvidia.com/gpu"
    pool = f" in pool {gang.pool}" if gang.pool else ""
    return what + pool


def place(gang: Gang, nodes: list[Node]) -> int:
    """How many of the gang's Pods fit (first fit; takes what it places from ``nodes``)."""
    placed = 0
    for _ in range(gang.size):
        for node in nodes:
            if eligible(node, gang.selector, gang.tolerations) and node.fits(dict(gang.request)):
                node.take(dict(gang.request))
                placed += 1
                break
        else:
            break
    return placed


def decide(
    waiting: Sequence[Gang],
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
) -> dict[tuple[str, str], Decision]:
    """Admit the waiting gangs, in :func:`order`, that fit whole; block those behind the
    first one that does not fit, per pool; number the rest per pool."""
    pods, nodes = list(pods), list(nodes)
    free = free_nodes(nodes, pods)
    empty = free_nodes(nodes, [])
    # Pods admitted (no gate) but not bound yet will take room too: reserve it first.
    for pod in pods:
        if not pod.get("spec", {}).get("nodeName") and not is_gated(pod) and not _is_terminal(pod):
            req = pod_requests(pod)
            selector = pod.get("spec", {}).get("nodeSelector", {})
            tols = pod.get("spec", {}).get("tolerations", [])
            for node in free:
                if eligible(node, selector, tols) and node.fits(req):
                    node.take(req)
                    break
    decisions: dict[tuple[str, str], Decision] = {}
    blocked_pools: dict[tuple[tuple[str, str], ...], tuple[str, str]] = {}
    for gang in order(waiting):
        need = describe_need(gang)
        candidates = [n for n in free if eligible(n, gang.selector, gang.tolerations)]
        if not candidates:
            decisions[gang.key] = Decision(
                False, 0, f"needs {need}; no Ready node matches the pool's selector and tolerations"
            )
            continue
        if place(gang, [Node(n.name, n.labels, n.taints, dict(n.free)) for n in empty]) < gang.size:
            # Even an idle pool cannot hold it: say so, and do not block the pool.
            decisions[gang.key] = Decision(
                False,
                0,
                f"needs {need}; the pool cannot hold it even when idle "
                f"({len(candidates)} matching node(s))",
            )
            continue
        trial = [Node(n.name, n.labels, n.taints, dict(n.free)) for n in free]
        fit = place(gang, trial)
        blocker = blocked_pools.get(gang.pool_key)
        if fit == gang.size and blocker is None:
            place(gang, free)
            decisions[gang.key] = Decision(True, fit, f"{need}: all fit")
            continue
        elif blocker is not None:
            decisions[gang.key] = Decision(
                False,
                fit,
                f"needs {need}; {fit} fit now; waiting behind {blocker[0]}/{blocker[1]} "
                "(first come, first served)",
            )
        else:
            blocked_pools[gang.pool_key] = gang.key
            decisions[gang.key] = Decision(False, fit, f"needs {need}; {fit} fit now")
    return _numbered(order(waiting), decisions)


def _numbered(
    ordered: Sequence[Gang], decisions: dict[tuple[str, str], Decision]
) -> dict[tuple[str, str], Decision]:
    """The decisions with each waiting gang's 1-based position in its pool's queue."""
    seen: dict[tuple[tuple[str, str], ...], int] = {}
    for gang in ordered:
        decision = decisions[gang.key]
        if not decision.admit:
            seen[gang.pool_key] = seen.get(gang.pool_key, 0) + 1
            decisions[gang.key] = replace(decision, position=seen[gang.pool_key])
    return decisions
