"""The Kopf handlers: short, each one hands a body to a reconciler.

Kopf watches TrainingRuns and Environments and calls the event handlers below; a
reconcile that fails for a passing reason (apiserver busy, conflict, network) is queued
again with backoff by :class:`Requeue`, and every unfinished object is resynced
periodically, so the operator is level-triggered and needs no finalizers or annotations
of its own on user objects. This is the only module (with ``controller.__init__``)
that imports kopf.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from torchyard import api, k8s
from torchyard.controller import reconcile

RESYNC_SECONDS = 60.0
RETRY_MIN, RETRY_MAX = 1.0, 60.0

Reconciler = Callable[[Mapping[str, Any], reconcile.Log], bool]


class Requeue:
    """Objects whose reconcile failed for a passing reason, with exponential backoff."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._due: dict[tuple[str, str, str], tuple[float, float]] = {}

    def failed(self, key: tuple[str, str, str]) -> float:
        with self._lock:
            _, delay = self._due.get(key, (0.0, RETRY_MIN / 2))
            delay = min(delay * 2, RETRY_MAX)
            self._due[key] = (time.monotonic() + delay, delay)
            return delay

    def succeeded(self, key: tuple[str, str, str]) -> None:
        with self._lock:
            self._due.pop(key, None)

    def due(self) -> list[tuple[str, str, str]]:
        now = time.monotonic()
        with self._lock:
            return [k for k, (at, _) in self._due.items() if at <= now]


REQUEUE = Requeue()
_LOCKS: dict[tuple[str, str, str], threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()

_RECONCILERS: dict[str, tuple[k8s.Resource, Reconciler]] = {
    "TrainingRun": (k8s.TRAININGRUNS, reconcile.trainingrun),
    "Environment": (k8s.ENVIRONMENTS, reconcile.environment),
}


def _lock_for(key: tuple[str, str, str]) -> threading.Lock:
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(key, threading.Lock())


def _plain(value: Any) -> Any:
    """Kopf hands read-only mapping views; reconcilers get plain dicts and lists."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def run_reconcile(kind: str, body: Mapping[str, Any], logger: reconcile.Log) -> None:
    """Reconcile one object, one reconcile per object at a time; never raises."""
    body = _plain(body)
    meta = body["metadata"]
    key = (kind, meta["namespace"], meta["name"])
    _, reconciler = _RECONCILERS[kind]
    with _lock_for(key):
        try:
            reconciler(body, logger)
        except k8s.ApiError as err:
            if err.not_found:  # deleted meanwhile: nothing left to do
                REQUEUE.succeeded(key)
                return
            delay = REQUEUE.failed(key)
            logger.warning("%s %s/%s: %s; retrying in %.0fs", kind, key[1], key[2], err, delay)
            return
        except Exception:  # a bug: say it loudly, but keep the operator alive
            delay = REQUEUE.failed(key)
            logger.exception(
                "%s %s/%s: reconcile failed; retrying in %.0fs", kind, key[1], key[2], delay
            )
            return
    REQUEUE.succeeded(key)


def _reconcile_fresh(kind: str, namespace: str, name: str, logger: reconcile.Log) -> None:
    res, _ = _RECONCILERS[kind]
    try:
        body = k8s.get(res, namespace, name)
    except k8s.ApiError as err:
        if err.not_found:
            REQUEUE.succeeded((kind, namespace, name))
            return
        REQUEUE.failed((kind, namespace, name))
        logger.warning("%s %s/%s: %s", kind, namespace, name, err)
        return
    run_reconcile(kind, body, logger)


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    """Kopf uses the same credentials as torchyard.k8s (kubeconfig or in-cluster)."""
    cfg = k8s.load().configuration
    auth = str((cfg.api_key or {}).get("authorization", ""))
    token = auth.removeprefix("Bearer ").strip() or None
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        token=token,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
    )


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = f"{api.GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=api.GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.execution.max_workers = 16
    memo.resync_task = asyncio.create_task(_resync_loop())


@kopf.on.cleanup()
async def stop_resync(memo: kopf.Memo, **_: Any) -> None:
    task = memo.get("resync_task")
    if task is not None:
        task.cancel()


async def _resync_loop() -> None:
    """Retry failed reconciles when due; resync every object every RESYNC_SECONDS."""
    logger = logging.getLogger("torchyard.resync")
    loop = asyncio.get_running_loop()
    last_full = time.monotonic()
    while True:
        await asyncio.sleep(1.0)
        for kind, namespace, name in REQUEUE.due():
            await loop.run_in_executor(None, _reconcile_fresh, kind, namespace, name, logger)
        if time.monotonic() - last_full >= RESYNC_SECONDS:
            last_full = time.monotonic()
            await loop.run_in_executor(None, _resync_all, logger)


def _resync_all(logger: reconcile.Log) -> None:
    for kind, (res, _) in _RECONCILERS.items():
        try:
            items = k8s.list_(res)
        except k8s.ApiError as err:
            logger.warning("resync of %s failed: %s", res.plural, err)
            continue
        for body in items:
            body.setdefault("apiVersion", res.api_version)
            body.setdefault("kind", kind)
            run_reconcile(kind, body, logger)


@kopf.on.event(api.GROUP, api.VERSION, "trainingruns")
def trainingrun_event(type: str, body: kopf.Body, logger: reconcile.Log, **_: Any) -> None:
    if type == "DELETED":
        return
    run_reconcile("TrainingRun", body, logger)


@kopf.on.event(api.GROUP, api.VERSION, "environments")
def environment_event(type: str, body: kopf.Body, logger: reconcile.Log, **_: Any) -> None:
    if type == "DELETED":
        return
    run_reconcile("Environment", body, logger)
