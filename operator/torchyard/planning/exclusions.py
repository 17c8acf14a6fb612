"""Bad nodes left out: the node affinity that keeps a run's next attempts off its bad nodes.

A run's ``status.excludedNodes`` (``status.exclusions`` decides which nodes go there) turns
into a *required* node affinity on every node Pod of the next attempt: one
``matchFields`` term ``metadata.name NotIn [...]`` (the Node's name, not a label a node may
lack), ANDed by the scheduler with the Pod's node selector. :func:`node_affinity` builds it
(``planning.pods.pod`` calls it); :func:`excluded_of` reads the names back from a Pod, so
that gang admission (``planning.admission``) does not count those nodes' capacity for the
run. Pure; tested in tests/unit/planning/test_exclusions.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# The field of a Node that a matchFields term may select on.
NODE_NAME_FIELD = "metadata.name"


def node_affinity(nodes: Iterable[str]) -> dict[str, Any] | None:
    """The Pod's ``affinity`` that keeps it off ``nodes`` (None for no node)."""
    names = sorted(set(nodes))
    if not names:
        return None
    term = {"matchFields": [{"key": NODE_NAME_FIELD, "operator": "NotIn", "values": names}]}
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }


def excluded_of(pod: Mapping[str, Any]) -> frozenset[str]:
    """The node names a Pod's required node affinity rules out with ``metadata.name NotIn``
    in every one of its terms (a name ruled out by only some terms may still be chosen)."""
    required = (pod.get("spec", {}).get("affinity") or {}).get("nodeAffinity", {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    found: frozenset[str] | None = None
    for term in terms:
        names: set[str] = set()
        for expr in term.get("matchFields") or []:
            if expr.get("key") == NODE_NAME_FIELD and expr.get("operator") == "NotIn":
                names.update(str(v) for v in expr.get("values") or [])
        found = frozenset(names) if found is None else found & names
    return found or frozenset()
