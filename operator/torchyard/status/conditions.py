"""Kubernetes-style conditions as pure functions.

``merge`` keeps a condition's ``lastTransitionTime`` while its status stays the same, so a
status recomputed from the same observations is byte-for-byte the same and the
controller can skip the patch. ``progress`` gives the kstatus conditions (Reconciling,
Stalled) that GitOps tools read; ``invalid_spec_status`` the one status of a spec the
controller cannot run; ``phase_event`` the Event a phase change deserves.
Called by the status computations of this package and by the controller.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from torchyard.api.times import parse_time as parse_time  # the status layer's name


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


def progress(
    reconciling: bool,
    stalled: bool,
    reason: str,
    message: str,
    *,
    observed_generation: int | None = None,
) -> list[dict[str, Any]]:
    """``Reconciling`` and ``Stalled``, the conditions kstatus (Flux, kpt, cli-utils) reads
    besides ``observedGeneration``: Reconciling True while the object is on its way,
    Stalled True when it got stuck in a way only its user can fix (a failed build, an
    invalid spec, a failed run). Both stay present with status False otherwise, so that
    ``kubectl wait --for=condition=Stalled=false`` has something to wait on."""
    gen = observed_generation
    return [
        condition("Reconciling", reconciling, reason, message, observed_generation=gen),
        condition("Stalled", stalled, reason, message, observed_generation=gen),
    ]


INVALID_SPEC = "InvalidSpec"


def invalid_spec_status(
    generation: int | None,
    message: str,
    previous: Mapping[str, Any] | None,
    now: datetime,
    *,
    failed_condition: bool = True,
    fields: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The status of a resource whose spec the controller cannot run, one shape for every
    kind: phase Failed; Accepted False, Failed True (``failed_condition``: the kinds that
    have one), Ready False, Reconciling False and Stalled True, each with reason
    InvalidSpec and the ``message`` naming the field; ``observedGeneration``; then the
    kind's own ``fields`` (a run's failure, a sweep's kept pins). Said once: nothing more
    happens until the spec changes. Called by each kind's status module."""
    gen = generation
    desired = [condition("Accepted", False, INVALID_SPEC, message, observed_generation=gen)]
    if failed_condition:
        desired.append(condition("Failed", True, INVALID_SPEC, message, observed_generation=gen))
    desired += [
        condition("Ready", False, INVALID_SPEC, message, observed_generation=gen),
        *progress(False, True, INVALID_SPEC, message, observed_generation=gen),
    ]
    status: dict[str, Any] = {**(fields or {}), "phase": "Failed"}
    if generation is not None:
        status["observedGeneration"] = generation
    status["conditions"] = merge((previous or {}).get("conditions"), desired, now)
    return status


def phase_event(
    previous: Mapping[str, Any] | None, new: Mapping[str, Any], *, failed: str = "Failed"
) -> tuple[str, str, str] | None:
    """The Event a phase change deserves, as (type, reason, message), or None when the
    phase stayed. A failure is a Warning whose reason is the Ready condition's (the
    failure's own reason); any other phase is a Normal Event named after the phase."""
    phase = new.get("phase")
    if not phase or phase == (previous or {}).get("phase"):
        return None
    ready = find(new.get("conditions"), "Ready") or {}
    message = str(ready.get("message") or "")
    if phase == failed:
        return "Warning", str(ready.get("reason") or failed), message
    return "Normal", str(phase), message
