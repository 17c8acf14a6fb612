"""``policy.activeDeadlineSeconds`` as time running, suspensions left out, as pure functions.

The deadline counts the run's time from ``status.startTime`` (when it first ran), across
all its attempts, less every interval it was suspended, as Kubernetes' Job stops its timer
while suspended. A suspension (``spec.suspend``, or Kueue stopping the gang) starts the
interval (``status.suspendedSince``, :func:`paused`); it ends when the gang runs again,
and :func:`with_suspensions` adds it to ``status.suspendedSeconds``. The failure policy compares
the deadline with :func:`counted_from` (``startTime`` moved on by the time suspended), and
every attempt's node Pods get what is left, :func:`pod_seconds`, as their own
``activeDeadlineSeconds``, so that the kubelet's limit and the run's agree.
Called by ``status.trainingruns``, ``status.suspensions`` and ``controller.trainingruns``;
tested in tests/unit/status/test_deadlines.py and on a real control plane in
tests/integration/test_suspend.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from torchyard.api import Phase, TrainingRun
from torchyard.api.times import parse_time
from torchyard.status.conditions import timestamp

SUSPENDED_SECONDS = "suspendedSeconds"  # earlier suspensions, whole seconds
SUSPENDED_SINCE = "suspendedSince"  # the suspension going on, if any


def suspended_seconds(status: Mapping[str, Any], now: datetime) -> float:
    """The seconds the run spent suspended since it started, the ongoing suspension too."""
    total = float(status.get(SUSPENDED_SECONDS) or 0)
    since = parse_time(status.get(SUSPENDED_SINCE))
    if since is not None:
        total += max(0.0, (now - since).total_seconds())
    return total


def counted_from(status: Mapping[str, Any], now: datetime) -> datetime | None:
    """When the deadline's clock started, had the run never been suspended: ``startTime``
    moved on by the time suspended. None before the run first ran."""
    started = parse_time(status.get("startTime"))
    if started is None:
        return None
    return started + timedelta(seconds=suspended_seconds(status, now))


def active_seconds(status: Mapping[str, Any], now: datetime) -> float | None:
    """The seconds the run has been running (its suspensions left out); None before it ran."""
    start = counted_from(status, now)
    return None if start is None else max(0.0, (now - start).total_seconds())


def pod_seconds(run: TrainingRun, status: Mapping[str, Any], now: datetime) -> int | None:
    """The node Pods' ``activeDeadlineSeconds`` for an attempt made now: what is left of the
    run's deadline (at least 1, rounded down so that it never grows while the run runs), the
    whole deadline before the run first ran, None without one."""
    deadline = run.spec.policy.active_deadline_seconds
    if not deadline:
        return None
    active = active_seconds(status, now)
    if active is None:
        return deadline
    return max(1, min(deadline, math.floor(deadline - active)))


def paused(status: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The fields that start a suspension interval now (none before the run first ran, or
    when one goes on already)."""
    if not status.get("startTime") or status.get(SUSPENDED_SINCE):
        return {}
    return {SUSPENDED_SINCE: timestamp(now)}


def with_suspensions(
    new: dict[str, Any], previous: Mapping[str, Any], now: datetime
) -> dict[str, Any]:
    """``new`` (a status computed from ``previous``) with the suspension bookkeeping kept,
    and an ongoing suspension closed once the gang runs again."""
    out = {k: v for k, v in new.items() if k not in (SUSPENDED_SECONDS, SUSPENDED_SINCE)}
    total = int(previous.get(SUSPENDED_SECONDS) or 0)
    since = previous.get(SUSPENDED_SINCE)
    if since and new.get("phase") == Phase.RUNNING.value:
        # Rounded down: the time left never grows (a Pod's activeDeadlineSeconds may only
        # be lowered).
        total = math.floor(suspended_seconds(previous, now))
        since = None
    if total:
        out[SUSPENDED_SECONDS] = total
    if since:
        out[SUSPENDED_SINCE] = since
    return out
