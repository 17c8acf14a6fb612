"""The work queue between Kopf's events and the reconcilers: keys, workers and resyncs.

Each Kopf event puts the key of the object to reconcile on :class:`WorkQueue`; the
:func:`worker` tasks take keys one at a time per key, and :func:`reconcile_key` fetches
the object fresh and calls its reconciler (``trainingruns.reconcile``,
``environments.reconcile``) in a thread: many events for one run while it is being
reconciled collapse into one more reconcile. A reconcile that fails for a passing reason
(apiserver busy, conflict, network) is queued again with exponential backoff; one that
asks for it (TTL, deadlines, waiting for old Pods to go) is queued again after that
delay; :func:`resync` queues every object again every RESYNC_SECONDS. With
``--namespace`` the queue and the resync keep to the watched namespaces. No Kopf here:
``handlers`` starts the tasks; tested in tests/unit/controller/test_controller_settings.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torchyard import k8s
from torchyard.controller import context, environments, telemetry, trainingruns

RESYNC_SECONDS = 60.0
RETRY_MIN, RETRY_MAX = 0.5, 60.0

Key = context.Key
Reconciler = Callable[[Mapping[str, Any], context.Log, context.Context], context.Result]

_RECONCILERS: dict[str, tuple[k8s.Resource, Reconciler]] = {
    "TrainingRun": (k8s.TRAININGRUNS, trainingruns.reconcile),
    "Environment": (k8s.ENVIRONMENTS, environments.reconcile),
}
logger = logging.getLogger("torchyard.controller")


class WorkQueue:
    """Keys to reconcile, each at most once at a time, with per-key due times.

    With ``namespaces`` (a namespaced operator), keys of other namespaces are dropped:
    gang admission sees every gang of the cluster, also another installation's, and
    must not make this operator reconcile (and be refused) what it does not watch.
    """

    def __init__(self, namespaces: Sequence[str] = ()) -> None:
        self.namespaces = frozenset(namespaces)
        self._due: dict[Key, float] = {}
        self._active: set[Key] = set()
        self._failures: dict[Key, int] = {}
        self._wake = asyncio.Event()

    def watches(self, namespace: str) -> bool:
        return not self.namespaces or namespace in self.namespaces

    def add(self, key: Key, delay: float = 0.0) -> None:
        if not self.watches(key[1]):
            return
        at = time.monotonic() + delay
        if key not in self._due or self._due[key] > at:
            self._due[key] = at
        self._wake.set()

    def backoff(self, key: Key) -> float:
        n = self._failures.get(key, 0) + 1
        self._failures[key] = n
        delay: float = min(RETRY_MIN * (2.0 ** (n - 1)), RETRY_MAX)
        self.add(key, delay)
        return delay

    def forget(self, key: Key) -> None:
        self._failures.pop(key, None)

    async def take(self) -> Key:
        while True:
            now = time.monotonic()
            ready = [k for k, at in self._due.items() if at <= now and k not in self._active]
            if ready:
                key = min(ready, key=lambda k: self._due[k])
                del self._due[key]
                self._active.add(key)
                return key
            waits = [at - now for k, at in self._due.items() if k not in self._active]
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=min(waits, default=1.0))

    def done(self, key: Key) -> None:
        self._active.discard(key)
        self._wake.set()


def reconcile_key(queue: WorkQueue, key: Key, ctx: context.Context) -> None:
    """Fetch the object fresh and reconcile it; never raises (runs in a thread)."""
    kind, namespace, name = key
    res, reconciler = _RECONCILERS[kind]
    log = logging.getLogger(f"torchyard.{kind.lower()}")
    started = time.monotonic()
    try:
        body = ctx.k8s.get(res, namespace, name)
        body.setdefault("apiVersion", res.api_version)
        body.setdefault("kind", kind)
        result = reconciler(body, log, ctx)
    except k8s.ApiError as err:
        if err.not_found:  # deleted meanwhile: owner references clean up the children
            queue.forget(key)
            return
        if err.status == 403 and "being terminated" in err.message:
            queue.forget(key)  # its namespace is going away, and the object with it
            return
        telemetry.RECONCILE_ERRORS.inc(kind=kind)
        delay = queue.backoff(key)
        log.warning("%s %s/%s: %s; retrying in %.1fs", kind, namespace, name, err, delay)
        return
    except Exception:  # a bug: say it loudly, but keep the operator alive
        telemetry.RECONCILE_ERRORS.inc(kind=kind)
        delay = queue.backoff(key)
        log.exception("%s %s/%s: reconcile failed; retrying in %.1fs", kind, namespace, name, delay)
        return
    finally:
        telemetry.RECONCILE_SECONDS.observe(time.monotonic() - started, kind=kind)
    queue.forget(key)
    if result.requeue_after is not None:
        queue.add(key, result.requeue_after)
    for other in result.also:
        queue.add(other)


async def worker(queue: WorkQueue, ctx: context.Context) -> None:
    loop = asyncio.get_running_loop()
    while True:
        key = await queue.take()
        try:
            await loop.run_in_executor(None, reconcile_key, queue, key, ctx)
        finally:
            queue.done(key)


def watched(namespaces: Sequence[str]) -> Sequence[str | None]:
    """Where to list: each watched namespace, or the whole cluster (None)."""
    return list(namespaces) or [None]


def resync_keys(namespaces: Sequence[str] = ()) -> list[Key]:
    """Every TrainingRun and Environment to reconcile again, listed per watched namespace
    (a namespaced operator may not list cluster-wide)."""
    keys: list[Key] = []
    for kind, (res, _) in _RECONCILERS.items():
        for namespace in watched(namespaces):
            try:
                items = k8s.list_(res, namespace)
            except k8s.ApiError as err:
                logger.warning("resync of %s in %s failed: %s", res.plural, namespace, err)
                continue
            keys += [(kind, o["metadata"]["namespace"], o["metadata"]["name"]) for o in items]
    return keys


async def resync(queue: WorkQueue) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(RESYNC_SECONDS)
        keys = await loop.run_in_executor(None, resync_keys, sorted(queue.namespaces))
        for key in keys:
            queue.add(key)
