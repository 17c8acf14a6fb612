"""What every reconcile shares: its :class:`Context`, its :class:`Result`, and the one
place where it writes status and Events.

A reconcile decides what to write into an :class:`Outcome` (the new status and the
Events that go with it) and hands it to :func:`write` once, at its end: the status is
applied only when it changed, then the Events are recorded. ``Context.k8s`` is the
facade of ``torchyard.k8s`` the reconcilers call: the operator's own ``k8s.Client``
behind ``reads.WatchedReads``, never the shared default client (the unit tests pass an
in-memory fake, tests/unit/controller/fake_k8s.py). Used by ``environments``,
``trainingruns`` and the policy modules beside them; ``handlers`` builds the Context.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal, Protocol

from torchyard import k8s, status
from torchyard.controller import cache as caches
from torchyard.planning import pods
from torchyard.planning import tracking as run_tracking
from torchyard.status.conditions import parse_time as parse_time  # the controller's name

Clock = Callable[[], datetime]
Log = logging.Logger | logging.LoggerAdapter[Any]
Key = tuple[str, str, str]  # (kind, namespace, name) of an object to reconcile
EventType = Literal["Normal", "Warning"]
# At most one status write per object in this many seconds when only its counts changed
# (``batched``).
BATCH_SECONDS = 1.0
_POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="torchyard-apply")


class K8s(Protocol):
    """The calls of ``torchyard.k8s`` that reconciling makes (``k8s.Client`` has them)."""

    def get(self, res: k8s.Resource, namespace: str | None, name: str) -> dict[str, Any]: ...

    def get_or_none(
        self, res: k8s.Resource, namespace: str | None, name: str
    ) -> dict[str, Any] | None: ...

    def list_(
        self,
        res: k8s.Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]: ...

    def apply(
        self, manifest: dict[str, Any], *, field_manager: str = ..., subresource: str = ...
    ) -> dict[str, Any]: ...

    def create(
        self, manifest: dict[str, Any], *, field_manager: str | None = ...
    ) -> dict[str, Any]: ...

    def apply_status(
        self, manifest: dict[str, Any], *, field_manager: str = ...
    ) -> dict[str, Any]: ...

    def merge_patch(
        self,
        res: k8s.Resource,
        namespace: str | None,
        name: str,
        patch: dict[str, Any],
        *,
        subresource: str = ...,
    ) -> dict[str, Any]: ...

    def delete(
        self,
        res: k8s.Resource,
        namespace: str | None,
        name: str,
        *,
        propagation: str = ...,
        grace_period_seconds: int | None = ...,
    ) -> bool: ...

    def record_event(
        self, obj: dict[str, Any], type_: str, reason: str, message: str, *, now: str
    ) -> dict[str, Any] | None: ...

    # (a reconcile reads the tail of a log and never follows one: it must not block)
    def pod_log_lines(
        self,
        namespace: str,
        pod: str,
        *,
        container: str | None = None,
        tail_lines: int | None = None,
        limit_bytes: int | None = None,
        timeout: float = ...,
    ) -> Iterator[str]: ...


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class Context:
    """Operator-wide inputs of every reconcile: builder settings, the clock, the API, and
    the watch-fed cache gang admission decides over (``admission``)."""

    # whose credentials: the operator's own client, named by whoever builds the Context
    k8s: K8s = field(kw_only=True)
    settings: pods.Settings = field(default_factory=pods.Settings)
    clock: Clock = utcnow
    cache: caches.Cache = field(default_factory=caches.Cache)
    # (kind, namespace, name) -> the resourceVersion of this operator's last status write:
    # the watch event that brings it back needs no reconcile (``handlers``, ``workqueue``).
    written: dict[Key, str] = field(default_factory=dict)
    # (kind, namespace, name) -> when this operator last wrote its status (``batched``)
    written_at: dict[Key, datetime] = field(default_factory=dict)
    # (namespace, name) of the shipped-modules ConfigMaps applied, and when (admission.ship)
    shipped: dict[tuple[str, str], datetime] = field(default_factory=dict)
    # run uid -> when its Pods' logs were last read for progress (``progress.poll``)
    progress_polls: dict[str, Any] = field(default_factory=dict)
    # (kind, namespace, name) -> "uid/generation" of the Environment build last recorded
    # (``recording.built_environment``)
    recorded: dict[Key, str] = field(default_factory=dict)
    # run uid -> (failed MLflow calls in a row, when to try again) (``tracking``)
    tracking_tries: dict[str, tuple[int, datetime]] = field(default_factory=dict)
    # namespace -> (when read, the data of its torchyard-tracking ConfigMap or None)
    # (``tracking.scoped``)
    tracking_overrides: dict[str, tuple[datetime, dict[str, Any] | None]] = field(
        default_factory=dict
    )
    # the chart's tracking settings, in a Context ``tracking.scoped`` made for a
    # namespace of its own (None: ``settings.tracking`` is the chart's)
    chart_tracking: run_tracking.Settings | None = None
    # what the cluster's Kueue offers, read at most once a minute (``workloads``): a
    # name ("workloads", "topologies") -> (when read, what was read)
    kueue: dict[str, tuple[datetime, Any]] = field(default_factory=dict)


@dataclass
class Result:
    """What the work queue should do next with this object."""

    requeue_after: float | None = None
    also: list[Key] = field(default_factory=list)  # other objects to reconcile


@dataclass(frozen=True)
class Event:
    """A core/v1 Event about the reconciled object."""

    type: EventType
    reason: str
    message: str


@dataclass
class Outcome:
    """What one reconcile writes, once, at its end: the status and then the Events."""

    status: dict[str, Any]
    at: datetime
    events: list[Event] = field(default_factory=list)


def phase_events(previous: Mapping[str, Any], new: Mapping[str, Any]) -> list[Event]:
    """The Event a phase change deserves (none while the phase stays)."""
    event = status.phase_event(previous, new)
    if event is None:
        return []
    type_, reason, message = event
    return [Event("Warning" if type_ == "Warning" else "Normal", reason, message)]


def key_of(body: Mapping[str, Any]) -> Key:
    """The work queue's key of ``body`` (kind, namespace, name)."""
    meta = body["metadata"]
    return str(body["kind"]), str(meta["namespace"]), str(meta["name"])


def batched(
    ctx: Context,
    body: Mapping[str, Any],
    outcome: Outcome,
    fields: frozenset[str],
    period: float = BATCH_SECONDS,
) -> float | None:
    """Seconds to hold ``outcome`` back, or None to write it now.

    A status that differs from the object's only in ``fields`` and in the messages of its
    conditions (a gang's Pod counts while it comes up: "3/256 scheduled"), and brings no
    Event, waits until ``period`` has passed since this operator's last write of it; the
    reconcile that comes then writes what it sees. The Job controller batches its Pod
    updates the same way (``podUpdateBatchPeriod``, 1 s): a gang of 256 coming up is a
    few writes, not one per Pod event, and every other change (a phase, a condition's
    status or reason, a failure) is written at once."""
    if outcome.events:
        return None
    old = dict(body.get("status") or {})
    if old == outcome.status or _facts(old, fields) != _facts(outcome.status, fields):
        return None
    last = ctx.written_at.get(key_of(body))
    if last is None:
        return None
    left = period - (outcome.at - last).total_seconds()
    return left if left > 0 else None


def _facts(st: Mapping[str, Any], counts: frozenset[str]) -> dict[str, Any]:
    """``st`` less the ``counts`` fields and the conditions' messages."""
    facts = {k: v for k, v in st.items() if k not in counts and k != "conditions"}
    facts["conditions"] = [
        {k: v for k, v in c.items() if k != "message"} for c in st.get("conditions") or []
    ]
    return facts


def write(ctx: Context, body: Mapping[str, Any], outcome: Outcome) -> bool:
    """Apply ``outcome.status`` unless the object already shows exactly that, then record
    its Events; True when the status was written. The only status write of a reconcile."""
    changed = dict(body.get("status") or {}) != outcome.status
    if changed:
        meta = body["metadata"]
        answer = ctx.k8s.apply_status(
            {
                "apiVersion": body["apiVersion"],
                "kind": body["kind"],
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                "status": outcome.status,
            }
        )
        key = key_of(body)
        ctx.written_at[key] = outcome.at
        version = (answer or {}).get("metadata", {}).get("resourceVersion")
        if version:
            ctx.written[key] = version
    now = status.timestamp(outcome.at)
    for event in outcome.events:
        ctx.k8s.record_event(dict(body), event.type, event.reason, event.message, now=now)
    return changed


def parallel(fn: Callable[[Any], Any], items: Iterable[Any]) -> None:
    """``fn`` over ``items`` on a shared thread pool (many Pods at once); an error of one
    call is raised here."""
    for future in [_POOL.submit(fn, item) for item in items]:
        future.result()


def live(pod: Mapping[str, Any]) -> bool:
    """The Pod has not finished (it may still hold its node's GPUs)."""
    return pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")


def delete_pods(
    ctx: Context,
    namespace: str,
    victims: Iterable[Mapping[str, Any]],
    grace_period_seconds: int = 5,
) -> None:
    """Delete Pods (those not already being deleted), with a short grace period; with
    ``grace_period_seconds=0`` at once, those being deleted too (their node is down: no
    kubelet will confirm their end)."""
    parallel(
        lambda p: ctx.k8s.delete(
            k8s.PODS, namespace, p["metadata"]["name"], grace_period_seconds=grace_period_seconds
        ),
        [
            p
            for p in victims
            if grace_period_seconds == 0 or not p["metadata"].get("deletionTimestamp")
        ],
    )
