"""The work queue between Kopf's events and the reconcilers: keys, lanes, workers, resyncs.

Each Kopf event puts the key of the object to reconcile on :class:`WorkQueue`; the
:func:`worker` tasks take keys one at a time per key, and :func:`reconcile_key` fetches
the object fresh and calls its reconciler (``trainingruns.reconcile``,
``environments.reconcile``, ``sweeps.reconcile``, ``endpoints.reconcile``) in a thread.
The queue holds each key once (many events for a run, queued or while it is being
reconciled, collapse into one more reconcile) and serves keys in the order they became
due, from three lanes: **status** (a run's own Pods changed, or the admission pass
admitted its gang) before **events** (other watch events, e.g. a new run, and the delays a
reconcile asks for: TTL, deadlines, restarts) before **background** (retries with
exponential backoff after a passing failure, and resync), so that a run's status write
never waits behind new runs or a resync of every other run; and a few workers serve the
status lane only, so it does not wait for a worker either. An idle queue sleeps until its
next due time or the next event: no timer ticks.

:func:`resync` is a cheap consistency check, not a reconcile of every object: every
``TORCHYARD_RESYNC_SECONDS`` (default 600) it lists the TrainingRuns, Environments, Sweeps
and OnlineEndpoints and queues, on the background lane and spread over the next period
(each key at its own offset), only those whose ``resourceVersion`` differs from the one
their last successful reconcile saw (an event this operator missed) or that were never
reconciled. With ``--namespace`` the queue and the resync keep to the watched namespaces.
No Kopf here: ``handlers`` starts the tasks; tested in
tests/unit/controller/test_workqueue.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import os
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torchyard import k8s
from torchyard.controller import (
    context,
    endpoints,
    environments,
    sweeps,
    telemetry,
    trainingruns,
)
from torchyard.launch.contract import TORCHYARD_RESYNC_SECONDS

RESYNC_SECONDS = 600.0  # the default of $TORCHYARD_RESYNC_SECONDS
RETRY_MIN, RETRY_MAX = 0.5, 60.0
# The lanes, served in this order: a run's own Pods changed or its gang was admitted (its
# status is due); other events and the delays a reconcile asks for; retries and resync.
STATUS, EVENTS, BACKGROUND = 0, 1, 2

Key = context.Key
Reconciler = Callable[[Mapping[str, Any], context.Log, context.Context], context.Result]

_RECONCILERS: dict[str, tuple[k8s.Resource, Reconciler]] = {
    "TrainingRun": (k8s.TRAININGRUNS, trainingruns.reconcile),
    "Environment": (k8s.ENVIRONMENTS, environments.reconcile),
    "Sweep": (k8s.SWEEPS, sweeps.reconcile),
    "OnlineEndpoint": (k8s.ONLINEENDPOINTS, endpoints.reconcile),
}
logger = logging.getLogger("torchyard.controller")


def resync_seconds() -> float:
    """$TORCHYARD_RESYNC_SECONDS, else :data:`RESYNC_SECONDS`; a clear error if it is bad."""
    raw = os.environ.get(TORCHYARD_RESYNC_SECONDS, "")
    if not raw:
        return RESYNC_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(
            f"{TORCHYARD_RESYNC_SECONDS}={raw!r} is not a positive number of seconds; "
            f"set it to e.g. {RESYNC_SECONDS:.0f}, or unset it for that default"
        )
    return value


class WorkQueue:
    """Keys to reconcile, each held once, served first-due-first from two lanes.

    A key is in at most one place: waiting for its due time (a timer), ready in a lane,
    or being reconciled (``take`` to ``done``); an ``add`` while it is being reconciled
    is kept and applied at ``done``. A ready key keeps its place when added again, and
    moves up to the events lane when an event comes for it. With ``namespaces`` (a
    namespaced operator), keys of other namespaces are dropped: gang admission sees every
    gang of the cluster, also another installation's, and must not make this operator
    reconcile (and be refused) what it does not watch.
    """

    def __init__(self, namespaces: Sequence[str] = (), clock: Callable[[], float] = time.monotonic):
        self.namespaces = frozenset(namespaces)
        self.clock = clock
        self._lanes: tuple[OrderedDict[Key, None], ...] = (
            OrderedDict(),
            OrderedDict(),
            OrderedDict(),
        )
        self._timers: dict[Key, tuple[float, int]] = {}  # key -> (due, lane)
        self._heap: list[tuple[float, int, Key, int]] = []  # (due, seq, key, lane)
        self._seq = 0
        self._active: set[Key] = set()
        self._later: dict[Key, tuple[float, int]] = {}  # adds while active: (due, lane)
        self._failures: dict[Key, int] = {}
        self.seen: dict[Key, str] = {}  # key -> resourceVersion its last reconcile saw
        self._wake = asyncio.Event()

    def watches(self, namespace: str) -> bool:
        return not self.namespaces or namespace in self.namespaces

    def __len__(self) -> int:
        """Keys waiting (ready or timed), not counting those being reconciled."""
        return sum(len(lane) for lane in self._lanes) + len(self._timers)

    def add(self, key: Key, delay: float = 0.0, lane: int = EVENTS) -> None:
        """Queue ``key`` in ``delay`` seconds on ``lane``; an earlier due time or a more
        urgent lane wins over what the key already has."""
        if not self.watches(key[1]):
            return
        at = self.clock() + max(0.0, delay)
        if key in self._active:
            held = self._later.get(key)
            if held is None or (at, lane) < held:
                self._later[key] = (at, lane)
            return
        self._promote(self.clock())  # timers already due go first: they were due earlier
        self._put(key, at, lane)
        self._wake.set()

    def _put(self, key: Key, at: float, lane: int) -> None:
        ready_in = next((i for i, q in enumerate(self._lanes) if key in q), None)
        if ready_in is not None:  # already ready: keep its place, or move up a lane
            if lane < ready_in and at <= self.clock():
                del self._lanes[ready_in][key]
                self._lanes[lane][key] = None
            return
        timer = self._timers.get(key)
        if timer is not None and timer <= (at, lane):
            return
        if at <= self.clock():
            self._timers.pop(key, None)
            self._lanes[lane][key] = None
            return
        self._timers[key] = (at, lane)
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, key, lane))

    def backoff(self, key: Key) -> float:
        """Queue ``key`` again on the background lane after 0.5, 1, 2 ... 60 s."""
        n = self._failures.get(key, 0) + 1
        self._failures[key] = n
        delay: float = min(RETRY_MIN * (2.0 ** (n - 1)), RETRY_MAX)
        self.add(key, delay, BACKGROUND)
        return delay

    def forget(self, key: Key) -> None:
        self._failures.pop(key, None)

    def _promote(self, now: float) -> float | None:
        """Move due timers into their lanes (in due order); the seconds to the next one."""
        while self._heap:
            at, _, key, lane = self._heap[0]
            if self._timers.get(key) != (at, lane):
                heapq.heappop(self._heap)  # superseded
                continue
            if at > now:
                return at - now
            heapq.heappop(self._heap)
            del self._timers[key]
            self._lanes[lane][key] = None
        return None

    def take_nowait(self, last_lane: int = BACKGROUND) -> Key | None:
        """The next ready key (the status lane first, each lane in due order) from the
        lanes up to ``last_lane``, or None."""
        self._promote(self.clock())
        for lane in self._lanes[: last_lane + 1]:
            if lane:
                key, _ = lane.popitem(last=False)
                self._active.add(key)
                return key
        return None

    async def take(self, last_lane: int = BACKGROUND) -> Key:
        while True:
            key = self.take_nowait(last_lane)
            if key is not None:
                return key
            wait = self._promote(self.clock())  # None: nothing timed, sleep until an add
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=wait)

    def caught_up(self, key: Key, version: str) -> bool:
        """Whether the last reconcile of ``key`` saw ``version`` and nothing is due for it
        now (not ready, not being reconciled; a timer for later is not due): what a
        test waits for before it says that nothing more was written."""
        timer = self._timers.get(key)
        return (
            self.seen.get(key) == version
            and key not in self._active
            and key not in self._later
            and not any(key in lane for lane in self._lanes)
            and (timer is None or timer[0] > self.clock())
        )

    def done(self, key: Key) -> None:
        self._active.discard(key)
        later = self._later.pop(key, None)
        if later is not None:
            self._promote(self.clock())
            self._put(key, *later)
        self._wake.set()


@dataclass(frozen=True)
class Followup:
    """What one :func:`reconcile_key` asks of the queue (applied by :func:`follow_up`)."""

    gone: bool = False  # the object is gone: forget it
    failed: bool = False  # a passing failure: retry with backoff
    version: str = ""  # the resourceVersion the reconcile saw
    requeue_after: float | None = None
    also: tuple[Key, ...] = ()


def reconcile_key(key: Key, ctx: context.Context) -> Followup:
    """Fetch the object fresh and reconcile it; never raises (runs in a thread, and
    leaves the queue alone: :func:`follow_up` applies what comes back, in the loop)."""
    kind, namespace, name = key
    res, reconciler = _RECONCILERS[kind]
    log = logging.getLogger(f"torchyard.{kind.lower()}")
    started = time.monotonic()
    try:
        body = ctx.k8s.get(res, namespace, name)
        version = str(body.get("metadata", {}).get("resourceVersion") or "")
        body.setdefault("apiVersion", res.api_version)
        body.setdefault("kind", kind)
        before = ctx.written.get(key)
        result = reconciler(body, log, ctx)
        after = ctx.written.get(key)
        if after is not None and after != before:
            version = after  # its own status write: the version the object has now
    except k8s.ApiError as err:
        if err.not_found:  # deleted meanwhile: owner references clean up the children
            ctx.written.pop(key, None)
            return Followup(gone=True)
        if err.status == 403 and "being terminated" in err.message:
            return Followup(gone=True)  # its namespace is going away, and the object with it
        telemetry.RECONCILE_ERRORS.inc(kind=kind)
        log.warning("%s %s/%s: %s; retrying with backoff", kind, namespace, name, err)
        return Followup(failed=True)
    except Exception:  # a bug: say it loudly, but keep the operator alive
        telemetry.RECONCILE_ERRORS.inc(kind=kind)
        log.exception("%s %s/%s: reconcile failed; retrying with backoff", kind, namespace, name)
        return Followup(failed=True)
    finally:
        telemetry.RECONCILE_SECONDS.observe(time.monotonic() - started, kind=kind)
    return Followup(version=version, requeue_after=result.requeue_after, also=tuple(result.also))


def follow_up(queue: WorkQueue, key: Key, outcome: Followup) -> None:
    if outcome.gone:
        queue.forget(key)
        queue.seen.pop(key, None)
        return
    if outcome.failed:
        queue.backoff(key)
        return
    queue.forget(key)
    queue.seen[key] = outcome.version
    if outcome.requeue_after is not None:
        queue.add(key, outcome.requeue_after)
    for other in outcome.also:
        queue.add(other)


async def worker(queue: WorkQueue, ctx: context.Context, last_lane: int = BACKGROUND) -> None:
    """Reconcile the keys taken from the lanes up to ``last_lane``: a worker kept for the
    status lane (``last_lane=STATUS``) is free for a run whose Pods changed however many
    new runs the others are creating Pods for."""
    loop = asyncio.get_running_loop()
    while True:
        key = await queue.take(last_lane)
        try:
            followup = await loop.run_in_executor(None, reconcile_key, key, ctx)
            follow_up(queue, key, followup)
        finally:
            queue.done(key)


def watched(namespaces: Sequence[str]) -> Sequence[str | None]:
    """Where to list: each watched namespace, or the whole cluster (None)."""
    return list(namespaces) or [None]


def resync_versions(client: k8s.Client, namespaces: Sequence[str] = ()) -> dict[Key, str]:
    """Every TrainingRun, Environment and Sweep with its resourceVersion, listed per watched
    namespace (a namespaced operator may not list cluster-wide) from the apiserver."""
    found: dict[Key, str] = {}
    for kind, (res, _) in _RECONCILERS.items():
        for namespace in watched(namespaces):
            try:
                items = client.list_(res, namespace)
            except k8s.ApiError as err:
                logger.warning("resync of %s in %s failed: %s", res.plural, namespace, err)
                continue
            for o in items:
                meta = o["metadata"]
                found[(kind, meta["namespace"], meta["name"])] = str(meta.get("resourceVersion"))
    return found


def resync_keys(client: k8s.Client, namespaces: Sequence[str] = ()) -> list[Key]:
    """Every TrainingRun and Environment (see :func:`resync_versions`)."""
    return list(resync_versions(client, namespaces))


def offset(key: Key, period: float) -> float:
    """Where in the period ``key``'s resync falls: stable per key, spread evenly."""
    return (zlib.crc32("/".join(key).encode()) % 10_000) / 10_000 * period


def stale(queue: WorkQueue, versions: Mapping[Key, str]) -> list[Key]:
    """The keys whose last reconcile saw another resourceVersion, or none at all; keys
    of objects that are gone are forgotten."""
    for key in [k for k in queue.seen if k not in versions]:
        del queue.seen[key]
    return [k for k, v in versions.items() if queue.seen.get(k) != v]


def schedule_resync(queue: WorkQueue, versions: Mapping[Key, str], period: float) -> list[Key]:
    """Queue the stale keys on the background lane, each at its offset in the period."""
    keys = stale(queue, versions)
    for key in keys:
        queue.add(key, offset(key, period), BACKGROUND)
    return keys


async def resync(queue: WorkQueue, client: k8s.Client, period: float | None = None) -> None:
    period = resync_seconds() if period is None else period
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(period)
        namespaces = sorted(queue.namespaces)
        versions = await loop.run_in_executor(None, resync_versions, client, namespaces)
        keys = schedule_resync(queue, versions, period)
        if keys:
            logger.info("resync: %d of %d objects changed unseen; queued", len(keys), len(versions))
