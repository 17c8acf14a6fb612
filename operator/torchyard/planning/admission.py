"""Gang admission without an external scheduler: does the whole gang fit its pool now?

A run's node Pods are created with a scheduling gate; the operator lifts the gates of
all of them together, only when every Pod can be placed at once on the nodes of its
pool (node selector, taints tolerated, free ``nvidia.com/gpu``, cpu, memory and Pod
slots, after the Pods already bound and those admitted but not yet bound). Runs wait in
one queue per pool, in :func:`order` (higher priority class value first, then first
come, first served): while the first waiting run of a pool does not fit, no run behind
it in that pool is admitted, so two half-admitted runs can never deadlock the pool and a
big run is never starved by small ones. Each decision carries the run's position in its
pool's queue, exact for the first ``EXACT_POSITIONS`` (50) of a pool; further back, position
0 and a message that does not change while the head moves.

Pure: ``decide`` takes the observed nodes and Pods and the waiting gangs (``waiting_gangs``
finds them among the Pods), and returns a decision per gang. Called by the controller's
admission pass (``controller.admission``) under one lock, over its watch-fed cache
(``controller.cache``). Tested in tests/unit/planning/test_admission.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from functools import cached_property
from typing import Any

from torchyard.api.quantities import quantity as quantity  # re-exported: one parser
from torchyard.api.trainingrun_status import QUEUE_EXACT_POSITIONS
from torchyard.api.wire import NOT_READY_TAINTS
from torchyard.planning import topology
from torchyard.planning.exclusions import excluded_of
from torchyard.planning.names import LABEL_RUN
from torchyard.planning.pods import (
    GANG_GATE,
    GPU_RESOURCE,
    PLACEMENT_ANNOTATION,
    POOL_LABEL,
    QUEUED_AT_ANNOTATION,
)

TRACKED = ("cpu", "memory", GPU_RESOURCE, "pods")
# A waiting gang's exact place is kept (and written) for the first this many of its pool's
# queue; further back it is "more than 50 ahead", so that admitting the head moves (and
# rewrites the status of) at most this many runs, not the whole queue.
EXACT_POSITIONS = QUEUE_EXACT_POSITIONS

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
    """Schedulable, Ready, and not tainted not-ready or unreachable: the node lifecycle
    controller takes that taint off a while after the node is Ready again, and a gang
    admitted there meanwhile (its Pods tolerate the taint for 300 s) would be failed at
    once as on a node that is down (``status.exclusions.unhealthy``)."""
    spec = node.get("spec", {})
    if spec.get("unschedulable"):
        return False
    if any(t.get("key") in NOT_READY_TAINTS for t in spec.get("taints") or []):
        return False
    conds = node.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def free_nodes(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> list[Node]:
    """Ready nodes with their allocatable minus what bound, live Pods request."""
    out = {}
    for node in nodes:
        if not _ready(node):
            continue
        alloc = node["status"].get("allocatable", {})  # a Ready node has a status
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
    node: Node,
    selector: Mapping[str, str],
    tolerations: Sequence[Mapping[str, Any]],
    excluded: frozenset[str] = frozenset(),
) -> bool:
    if node.name in excluded:  # status.excludedNodes: a bad node, not for this run
        return False
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
    excluded: frozenset[str] = frozenset()  # nodes its Pods' affinity rules out (bad nodes)
    placement: topology.Request | None = None  # spec.placement (``planning.topology``)

    @cached_property
    def pool_key(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(self.selector.items()))

    @cached_property
    def shape(self) -> tuple[Any, ...]:
        """What placing the gang depends on besides the nodes: gangs of one shape place
        alike."""
        return (
            self.pool_key,
            repr(self.tolerations),
            tuple(sorted(self.request.items())),
            self.size,
            tuple(sorted(self.excluded)),
            self.placement,
        )


@dataclass(frozen=True)
class Decision:
    admit: bool
    fit_now: int
    message: str
    position: int = 0  # 1-based place in its pool's queue when not admitted; 0 when admitted
    # (or further back than EXACT_POSITIONS)
    blocking: bool = False  # the first gang of its pool that does not fit: the rest wait
    # an admitted gang with a placement: node rank i's node selector (its domain)
    selectors: tuple[Mapping[str, str], ...] = ()


def order_key(gang: Gang) -> tuple[int, str, tuple[str, str]]:
    """Where a gang sorts in its pool's queue: priority value, then age."""
    return (-gang.priority, gang.created, gang.key)


def order(waiting: Iterable[Gang]) -> list[Gang]:
    """The order in which a pool's gangs are served: priority value, then age."""
    return sorted(waiting, key=order_key)


def gang_of(key: tuple[str, str], created: str, size: int, pod: Mapping[str, Any]) -> Gang:
    """A gang of ``size`` Pods like ``pod``, waiting since ``created``."""
    spec = pod["spec"]
    text = (pod.get("metadata", {}).get("annotations") or {}).get(PLACEMENT_ANNOTATION)
    return Gang(
        key=key,
        created=created,
        size=size,
        request=pod_requests(pod),
        selector=spec.get("nodeSelector", {}),
        tolerations=spec.get("tolerations", []),
        pool=spec.get("nodeSelector", {}).get(POOL_LABEL, ""),
        priority=int(spec.get("priority") or 0),
        excluded=excluded_of(pod),
        placement=topology.Request.from_json(text) if text else None,
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
    gpus = gang.request.get(GPU_RESOURCE)
    what = f"{gang.size} node(s)"
    if gpus:
        what += f" with {gpus:f} nvidia.com/gpu"
    pool = f" in pool {gang.pool}" if gang.pool else ""
    return what + pool


def slots(node: Node, request: Mapping[str, Decimal]) -> int:
    """How many Pods asking for ``request`` fit ``node``'s free room."""
    counts = [int(node.free.get(k, Decimal(0)) // v) for k, v in request.items() if v > 0]
    return max(0, min(counts)) if counts else 0


def room(gang: Gang, nodes: Sequence[Node]) -> dict[topology.Domain, int]:
    """How many of ``gang``'s Pods each domain of its placement has room for now."""
    assert gang.placement is not None
    levels = gang.placement.levels
    out: dict[topology.Domain, int] = {}
    for node in nodes:
        domain = topology.domain_of(node.labels, levels)
        if domain is not None and eligible(node, gang.selector, gang.tolerations, gang.excluded):
            out[domain] = out.get(domain, 0) + slots(node, gang.request)
    return out


def pack(gang: Gang, nodes: Sequence[Node]) -> topology.Packing:
    """The domains ``gang`` (with a placement) would take of ``nodes`` now."""
    assert gang.placement is not None
    return topology.pack(gang.placement, gang.size, room(gang, nodes))


def admit_into(gang: Gang, nodes: list[Node]) -> tuple[Mapping[str, str], ...]:
    """Take ``gang``'s room from ``nodes`` (it fits whole): for a gang with a placement,
    in the domains :func:`pack` chose, and node rank i's node selector for each."""
    if gang.placement is None:
        place(gang, nodes)
        return ()
    packing = pack(gang, nodes)
    _take(gang, nodes, packing)
    levels = gang.placement.levels
    return tuple(topology.selector(levels, d) for d in topology.ranks(packing.domains))


def _take(gang: Gang, nodes: list[Node], packing: topology.Packing) -> None:
    """Take the room of ``packing``'s share of ``gang`` from the nodes of each domain."""
    assert gang.placement is not None
    levels = gang.placement.levels
    for domain, count in packing.domains:
        inside = [n for n in nodes if topology.domain_of(n.labels, levels) == domain]
        share = Gang(
            gang.key,
            gang.created,
            count,
            gang.request,
            gang.selector,
            gang.tolerations,
            excluded=gang.excluded,
        )
        place(share, inside)


def place(gang: Gang, nodes: list[Node]) -> int:
    """How many of the gang's Pods fit (first fit; takes what it places from ``nodes``;
    a gang with a placement: in the domains :func:`pack` chooses, all or none).
    A node that cannot take one more of the gang's Pods cannot take one later in this
    call either (room only shrinks), so each Pod's scan starts at the node the last one
    went to: one pass over the nodes, not one per Pod (a 256-node gang was 65,536 checks
    before its Pods were created)."""
    if gang.placement is not None:
        packing = pack(gang, nodes)
        if packing.placed == gang.size:
            _take(gang, nodes, packing)
        return packing.placed
    placed, start = 0, 0
    request = dict(gang.request)
    for _ in range(gang.size):
        for i in range(start, len(nodes)):
            node = nodes[i]
            if eligible(node, gang.selector, gang.tolerations, gang.excluded) and node.fits(
                request
            ):
                node.take(request)
                placed += 1
                start = i
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
    first one that does not fit, per pool; number the rest per pool (beyond the first
    :data:`EXACT_POSITIONS` of a pool, position 0 and a message that does not move).

    What placing a gang finds depends only on its shape and the free room, so it is
    worked out once per shape while the free room stays as it is: a pass over thousands
    of like gangs behind a blocked head costs a dictionary look-up each. With no gang
    waiting there is nothing to decide, and the free room is not worked out (the passes
    while an admitted gang's Pods are bound, one per burst of their events)."""
    if not waiting:
        return {}
    pods, nodes = list(pods), list(nodes)
    free = free_nodes(nodes, pods)
    empty = free_nodes(nodes, [])
    _reserve_admitted(pods, free)
    queue = _Pass(free, empty)
    ordered = order(waiting)
    for gang in ordered:
        queue.decide(gang)
    return _numbered(ordered, queue.decisions)


def _reserve_admitted(pods: Sequence[Mapping[str, Any]], free: list[Node]) -> None:
    """Take from ``free`` the room of the Pods admitted (no gate) but not bound yet: they
    will take it too (first fit; Pods of one shape resume where the last went, as in
    ``place``)."""
    resume: dict[str, int] = {}
    for pod in pods:
        if not pod.get("spec", {}).get("nodeName") and not is_gated(pod) and not _is_terminal(pod):
            req = pod_requests(pod)
            selector = pod.get("spec", {}).get("nodeSelector", {})
            tols = pod.get("spec", {}).get("tolerations", [])
            avoid = excluded_of(pod)  # a run's bad nodes (``planning.exclusions``)
            like = repr((sorted(req.items()), sorted(selector.items()), tols, sorted(avoid)))
            for i in range(resume.get(like, 0), len(free)):
                if eligible(free[i], selector, tols, avoid) and free[i].fits(req):
                    free[i].take(req)
                    resume[like] = i
                    break
            else:
                resume[like] = len(free)


@dataclass
class _Pass:
    """One pass of :func:`decide` over the waiting gangs in :func:`order`: the free room
    (``free``, less each gang admitted), the idle pool (``empty``), and the decisions."""

    free: list[Node]
    empty: list[Node]
    decisions: dict[tuple[str, str], Decision] = field(default_factory=dict)
    blocked_pools: dict[tuple[tuple[str, str], ...], tuple[str, str]] = field(default_factory=dict)
    ahead: dict[tuple[tuple[str, str], ...], int] = field(default_factory=dict)  # per pool
    # shape -> (matching nodes, of those with its placement's level, fits the idle pool,
    # the most one domain of its placement holds when idle); shape -> (fit now, why not),
    # while free stays
    statics: dict[tuple[Any, ...], tuple[int, int, bool, int]] = field(default_factory=dict)
    fits_now: dict[tuple[Any, ...], tuple[int, str]] = field(default_factory=dict)

    def decide(self, gang: Gang) -> None:
        """Admit ``gang`` if it fits whole and its pool is not blocked; else say why not."""
        need = describe_need(gang)
        never = self._unplaceable(gang, need)
        if never is not None:
            self._wait(gang, never)
            return
        blocker = self.blocked_pools.get(gang.pool_key)
        if blocker is not None and self.ahead.get(gang.pool_key, 0) >= EXACT_POSITIONS:
            # Far back in a blocked queue: a message that stays put while the head moves.
            self._wait(gang, Decision(False, 0, beyond_message(need)))
            return
        fit, why = self._fit_now(gang, need)
        if fit == gang.size and blocker is None:
            selectors = admit_into(gang, self.free)
            self.fits_now.clear()  # the free room changed
            self.decisions[gang.key] = Decision(
                True, fit, f"{need}: all fit{_where(gang, selectors)}", selectors=selectors
            )
            return
        if blocker is not None:
            decision = Decision(
                False,
                fit,
                f"{why}; waiting behind {blocker[0]}/{blocker[1]} (first come, first served)",
            )
        else:
            self.blocked_pools[gang.pool_key] = gang.key
            decision = Decision(False, fit, why, blocking=True)
        self._wait(gang, decision)

    def _wait(self, gang: Gang, decision: Decision) -> None:
        """``gang`` waits (``decision``): one more gang ahead of the next in its pool."""
        self.decisions[gang.key] = decision
        self.ahead[gang.pool_key] = self.ahead.get(gang.pool_key, 0) + 1

    def _unplaceable(self, gang: Gang, need: str) -> Decision | None:
        """Why ``gang`` cannot be placed in its pool however long it waits (no node
        matches, none has its placement's level, or even the idle pool cannot hold it: it
        does not block the pool), else None. Worked out once per shape."""
        shape = gang.shape
        if shape not in self.statics:
            found = [
                n for n in self.free if eligible(n, gang.selector, gang.tolerations, gang.excluded)
            ]
            level = gang.placement.level if gang.placement is not None else None
            labelled = sum(1 for n in found if level is None or level in n.labels)
            idle = [Node(n.name, n.labels, n.taints, dict(n.free)) for n in self.empty]
            largest = max(room(gang, idle).values(), default=0) if gang.placement else 0
            holds = place(gang, idle) == gang.size
            self.statics[shape] = (len(found), labelled, holds, largest)
        matching, labelled, holds, largest = self.statics[shape]
        if matching and not labelled and gang.placement is not None:
            level = gang.placement.level
            return Decision(
                False,
                0,
                f"needs {need}; no Ready node that matches the pool's selector and "
                f"tolerations has the label {level} (spec.placement.topology.level): label "
                "the nodes, or name a level they have" + _left_out(gang, self.free),
            )
        if not matching:
            return Decision(
                False,
                0,
                f"needs {need}; no Ready node matches the pool's selector and tolerations"
                + _left_out(gang, self.free),
            )
        if not holds and gang.placement is not None and gang.placement.mode == "required":
            unit = gang.placement.unit(gang.size)
            return Decision(
                False,
                0,
                f"needs {need}; no {gang.placement.level} can hold {unit} of its nodes even "
                f"when idle (the largest holds {largest}): a smaller sliceSize, or mode "
                "preferred" + _left_out(gang, self.free),
            )
        if not holds:
            return Decision(
                False,
                0,
                f"needs {need}; the pool cannot hold it even when idle "
                f"({matching} matching node(s){_left_out(gang, self.free)})",
            )
        return None

    def _fit_now(self, gang: Gang, need: str) -> tuple[int, str]:
        """How many of ``gang``'s Pods fit the free room now, and why it waits if not all
        (once per shape while the free room stays as it is)."""
        if gang.shape not in self.fits_now:
            trial = [Node(n.name, n.labels, n.taints, dict(n.free)) for n in self.free]
            if gang.placement is not None:
                packing = pack(gang, trial)
                why = topology.wait_message(gang.placement, gang.size, packing, need)
                self.fits_now[gang.shape] = (packing.placed, why)
            else:
                fit = place(gang, trial)
                self.fits_now[gang.shape] = (fit, f"needs {need}; {fit} fit now")
        return self.fits_now[gang.shape]


def _where(gang: Gang, selectors: Sequence[Mapping[str, str]]) -> str:
    """Where an admitted gang with a placement went (``topology.describe``)."""
    if gang.placement is None or not selectors:
        return ""
    level = gang.placement.level
    return topology.describe(level, [sel.get(level, "") for sel in selectors])


def _left_out(gang: Gang, nodes: Sequence[Node]) -> str:
    """'; 1 more left out as bad for this run (status.excludedNodes)', or ''."""
    bad = sum(
        1 for n in nodes if n.name in gang.excluded and eligible(n, gang.selector, gang.tolerations)
    )
    if not bad:
        return ""
    return f"; {bad} more left out as bad for this run (status.excludedNodes)"


def beyond_message(need: str) -> str:
    """The message of a gang more than :data:`EXACT_POSITIONS` places back in its queue."""
    return (
        f"needs {need}; more than {EXACT_POSITIONS} runs ahead of it in its pool's queue "
        "(first come, first served)"
    )


def _numbered(
    ordered: Sequence[Gang], decisions: dict[tuple[str, str], Decision]
) -> dict[tuple[str, str], Decision]:
    """The decisions with each waiting gang's 1-based position in its pool's queue, for
    the first :data:`EXACT_POSITIONS` of each pool (the rest keep position 0)."""
    seen: dict[tuple[tuple[str, str], ...], int] = {}
    for gang in ordered:
        decision = decisions[gang.key]
        if not decision.admit:
            seen[gang.pool_key] = seen.get(gang.pool_key, 0) + 1
            if seen[gang.pool_key] <= EXACT_POSITIONS:
                decisions[gang.key] = replace(decision, position=seen[gang.pool_key])
    return decisions
