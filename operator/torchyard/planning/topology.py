"""Where a gang goes in the network: the domains of a level it takes, and which node rank
goes to which domain.

A run's ``spec.placement`` becomes a :class:`Request`: the levels from the highest one
down to the one named (read from Kueue's ``Topology`` object that has that level, when one
exists: racks then sit inside blocks; else the level alone), the mode and the slice size.
A *domain* is a node's values of those levels (``("block-1", "rack-3")``).

:func:`pack` chooses the fewest domains that hold the gang now, given how many of its Pods
each domain has room for: ``required`` puts the whole gang (or each slice of
``sliceSize`` nodes) in one domain, the fullest one that fits (best fit, as Kueue's
topology-aware scheduling does, so that the emptier domains stay whole for bigger
gangs); ``preferred`` spills over as few domains as fit, staying inside one domain of the
level above when one holds them. Node ranks then follow the domains: :func:`ranks` gives
node rank *i* its domain, the domains in order, so that the nodes of one domain have
consecutive ``NODE_RANK`` s and rank order matches the network.

Pure. Used by ``planning.admission`` (torchyard's own gang admission) and
``planning.workloads`` (the ranks of a gang Kueue placed, and the Workload's topology
request). Tested in tests/unit/planning/test_topology.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torchyard.api.placement import Placement

# Kueue's lowest level: one node. A Topology that ends with it places single nodes.
HOSTNAME_LEVEL = "kubernetes.io/hostname"

Domain = tuple[str, ...]  # a node's values of the request's levels, highest first


@dataclass(frozen=True)
class Request:
    """A placement as admission reads it: the levels, the highest first and the one the
    run named last; the mode; the slice size (None: the gang is one piece)."""

    levels: tuple[str, ...]
    mode: str = "required"
    slice_size: int | None = None

    @property
    def level(self) -> str:
        return self.levels[-1]

    def unit(self, size: int) -> int:
        """How many nodes must stay together: a slice, the whole gang (required), or one."""
        if self.slice_size is not None:
            return self.slice_size
        return size if self.mode == "required" else 1

    def to_json(self) -> str:
        """The request as the gang's Pods carry it (``pods.PLACEMENT_ANNOTATION``)."""
        body: dict[str, object] = {"levels": list(self.levels), "mode": self.mode}
        if self.slice_size is not None:
            body["sliceSize"] = self.slice_size
        return json.dumps(body, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Request | None:
        """The request a Pod carries; None when the text is not one (a Pod edited by hand)."""
        try:
            body = json.loads(text)
            levels = tuple(str(v) for v in body["levels"])
            size = body.get("sliceSize")
            if not levels or body.get("mode") not in ("required", "preferred"):
                return None
            return cls(levels, str(body["mode"]), int(size) if size is not None else None)
        except (ValueError, KeyError, TypeError):
            return None


def levels_of(topology: Mapping[str, Any]) -> list[str]:
    """The node labels of a Kueue ``Topology`` object, highest first."""
    spec = topology.get("spec")
    levels = spec.get("levels") if isinstance(spec, Mapping) else None
    if not isinstance(levels, list):
        return []
    return [str(lv.get("nodeLabel")) for lv in levels if isinstance(lv, Mapping)]


def request(placement: Placement, topologies: Iterable[Mapping[str, Any]] = ()) -> Request:
    """The :class:`Request` of ``placement``: its level with the levels above it in the
    first Kueue ``Topology`` (by name) that has it, else its level alone."""
    level = placement.topology.level
    above: tuple[str, ...] = ()
    for topo in sorted(topologies, key=lambda t: str((t.get("metadata") or {}).get("name"))):
        levels = levels_of(topo)
        if level in levels:
            above = tuple(levels[: levels.index(level)])
            break
    return Request((*above, level), placement.topology.mode, placement.slice_size)


def domain_of(labels: Mapping[str, str], levels: Sequence[str]) -> Domain | None:
    """A node's domain: its values of ``levels``; None when it lacks the last one (the
    level the run named). A missing higher level reads as ''."""
    if levels[-1] not in labels:
        return None
    return tuple(str(labels.get(level, "")) for level in levels)


def selector(levels: Sequence[str], domain: Domain) -> dict[str, str]:
    """The node selector that keeps a Pod in ``domain`` (every level it has a value of)."""
    return {level: value for level, value in zip(levels, domain, strict=True) if value}


@dataclass(frozen=True)
class Packing:
    """The domains a gang takes, in node-rank order, with how many of its nodes each;
    ``placed`` < the gang's size: it does not fit now (``domains`` is then empty);
    ``largest``: the most of the gang's nodes one domain has room for (for the message)."""

    domains: tuple[tuple[Domain, int], ...]
    placed: int
    largest: int


def pack(request_: Request, size: int, room: Mapping[Domain, int]) -> Packing:
    """The fewest domains that hold a gang of ``size`` nodes, ``room`` saying how many of
    its nodes each domain has room for now (see the module docstring)."""
    unit = request_.unit(size)
    needed = size // unit
    units = {d: n // unit for d, n in room.items() if n // unit > 0}
    largest = max(room.values(), default=0)
    if sum(units.values()) < needed:
        return Packing((), sum(units.values()) * unit, largest)
    one = [d for d, u in units.items() if u >= needed]
    if one:  # best fit: the fullest domain that holds it
        chosen = {min(one, key=lambda d: (room[d], d)): needed}
    else:
        chosen = _spread(units, needed, len(request_.levels))
    ordered = tuple((d, chosen[d] * unit) for d in sorted(chosen))
    return Packing(ordered, size, largest)


def _spread(units: Mapping[Domain, int], needed: int, depth: int) -> dict[Domain, int]:
    """Units over several domains: inside the one domain of the lowest level above that
    holds them all (the fewest domains, then the least room left over), else anywhere;
    the fewest domains, the fullest last."""
    for keep in range(depth - 1, 0, -1):
        groups: dict[Domain, list[Domain]] = {}
        for d in units:
            groups.setdefault(d[:keep], []).append(d)
        fitting = [
            (len(_greedy(units, members, needed)), sum(units[m] for m in members), parent)
            for parent, members in groups.items()
            if sum(units[m] for m in members) >= needed
        ]
        if fitting:
            _, _, parent = min(fitting)
            return _greedy(units, groups[parent], needed)
    return _greedy(units, list(units), needed)


def _greedy(units: Mapping[Domain, int], among: Sequence[Domain], needed: int) -> dict[Domain, int]:
    """The biggest domains first until ``needed`` units are taken; the last one swapped for
    the smallest that still holds what is left (so the bigger ones stay whole)."""
    order = sorted(among, key=lambda d: (-units[d], d))
    taken: dict[Domain, int] = {}
    left = needed
    for i, d in enumerate(order):
        if left <= 0:
            break
        rest = [o for o in order[i:] if units[o] >= left]
        if rest:  # one domain holds what is left: the smallest such
            last = min(rest, key=lambda o: (units[o], o))
            taken[last] = left
            return taken
        taken[d] = units[d]
        left -= units[d]
    return taken


def ranks(domains: Sequence[tuple[Domain, int]]) -> list[Domain]:
    """Node rank *i*'s domain: the domains in order, each for as many ranks as its count."""
    return [d for d, count in domains for _ in range(count)]


def describe(level: str, values: Sequence[str]) -> str:
    """' in example.com/rack r1 (node ranks 0-3), r2 (node ranks 4-5)': where a gang went,
    ``values`` being node rank i's value of ``level``."""
    spans: list[list[Any]] = []
    for rank, value in enumerate(values):
        if spans and spans[-1][0] == value:
            spans[-1][2] = rank
        else:
            spans.append([value, rank, rank])
    if not spans:
        return ""
    parts = [f"{v} (node ranks {a}-{b})" if a != b else f"{v} (node rank {a})" for v, a, b in spans]
    return f" in {level} " + ", ".join(parts)


def wait_message(request_: Request, size: int, packing: Packing, need: str) -> str:
    """Why a gang that does not fit now waits, in the words of its placement (``need``:
    what the gang asks for, "8 node(s) with 8 nvidia.com/gpu in pool a100")."""
    level = request_.level
    if request_.slice_size is not None:
        slices = size // request_.slice_size
        return (
            f"needs {need} in slices of {request_.slice_size}, each in one {level}; "
            f"{packing.placed // request_.slice_size} of {slices} slice(s) fit now"
        )
    if request_.mode == "required":
        return f"needs {need} in one {level}; the largest free {level} has {packing.largest}"
    return f"needs {need}; {packing.placed} fit now"
