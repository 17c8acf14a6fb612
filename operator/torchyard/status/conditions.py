"""Kubernetes-style conditions as pure functions.

``merge`` keeps a condition's ``lastTransitionTime`` while its status stays the same, so a
status recomputed from the same observations is byte-for-byte the same and the
controller can skip the patch. Called by the status computations of this package.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any


def timestamp(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(
    type_: str,
    status: bool | str,
    reason: str,
    message: str = "",
    *,
    observed_generation: int | None = None,
) -> dict[str, Any]:
    """A condition without a transition time (``merge`` sets it)."""
    value = status if isinstance(status, str) else ("True" if status else "False")
    cond: dict[str, Any] = {"type": type_, "status": value, "reason": reason, "message": message}
    if observed_generation is not None:
        cond["observedGeneration"] = observed_generation
    return cond


def merge(
    previous: Iterable[Mapping[str, Any]] | None,
    desired: Iterable[dict[str, Any]],
    now: datetime,
) -> list[dict[str, Any]]:
    """Desired conditions, with ``lastTransitionTime`` carried over where status is unchanged."""
    before = {c.get("type"): c for c in previous or ()}
    out = []
    for cond in desired:
        old = before.get(cond["type"])
        if (
            old is not None
            and old.get("status") == cond["status"]
            and old.get("lastTransitionTime")
        ):
            when = old["lastTransitionTime"]
        else:
            when = timestamp(now)
        out.append({**cond, "lastTransitionTime": when})
    return out


def find(conditions: Iterable[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    for cond in conditions or ():
        if cond.get("type") == type_:
            return cond
    return None
