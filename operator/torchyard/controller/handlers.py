"""The Kopf handlers: they only put keys on a work queue.

Kopf watches TrainingRuns, Environments and the Pods torchyard made, and each event puts
the key of the object to reconcile on :class:`WorkQueue` (a Pod's event the key of its
run). Workers take keys one at a time per key, fetch the object fresh and call a
reconciler from ``reconcile.py`` in a thread: many events for one run while it is being
reconciled collapse into one more reconcile. A reconcile that fails for a passing reason
(apiserver busy, conflict, network) is queued again with exponential backoff; one that
asks for it (TTL, deadlines, waiting for old Pods to go) is queued again after that
delay; every object is resynced every RESYNC_SECONDS. So the operator is level-triggered
and keeps no state of its own on user objects (no finalizers, no annotations).
With ``--namespace`` the queue, the resync and a lost node's clean-up keep to the
watched namespaces (the operator's Roles grant nothing elsewhere).
With ``controller.operators`` the only module that imports kopf.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import kopf

from torchyard import api, k8s
from torchyard.controller import reconcile, telemetry
from torchyard.planning import names, pods
from torchyard.status import timestamp

RESYNC_SECONDS = 60.0
RETRY_MIN, RETRY_MAX = 0.5, 60.0
WORKERS = 8

Key = tuple[str, str, str]  # (kind, namespace, name)
Reconciler = Callable[[Mapping[str, Any], reconcile.Log, reconcile.Context], reconcile.Result]

_RECONCILERS: dict[str, tuple[k8s.Resource, Reconciler]] = {
    "TrainingRun": (k8s.TRAININGRUNS, reconcile.trainingrun),
    "Environment": (k8s.ENVIRONMENTS, reconcile.environment),
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


def _settings() -> pods.Settings:
    return pods.Settings(
        init_image=os.environ.get("TORCHYARD_INIT_IMAGE", pods.Settings.init_image),
        git_image=os.environ.get("TORCHYARD_GIT_IMAGE", pods.Settings.git_image),
        resolve_curated=os.environ.get("TORCHYARD_RESOLVE_CURATED", "all"),
        registry_url=os.environ.get("TORCHYARD_REGISTRY_URL", ""),
        registry_token_file=os.environ.get("TORCHYARD_REGISTRY_TOKEN_FILE", ""),
        registry_ca=_registry_ca(os.environ.get("TORCHYARD_REGISTRY_CA_FILE", "")),
    )


def _registry_ca(path: str) -> str:
    """The PEM of the CA that signed the registry's certificate (the chart mounts its
    ``ca.crt``): the operator verifies the service with it and passes it to node Pods."""
    if not path:
        return ""
    try:
        with open(path) as f:
            return f.read()
    except OSError as err:
        raise RuntimeError(
            f"TORCHYARD_REGISTRY_CA_FILE: cannot read the registry's CA certificate: {err}"
        ) from None


def reconcile_key(queue: WorkQueue, key: Key, ctx: reconcile.Context) -> None:
    """Fetch the object fresh and reconcile it; never raises (runs in a thread)."""
    kind, namespace, name = key
    res, reconciler = _RECONCILERS[kind]
    log = logging.getLogger(f"torchyard.{kind.lower()}")
    started = time.monotonic()
    try:
        body = k8s.get(res, namespace, name)
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


async def _worker(queue: WorkQueue, ctx: reconcile.Context) -> None:
    loop = asyncio.get_running_loop()
    while True:
        key = await queue.take()
        try:
            await loop.run_in_executor(None, reconcile_key, queue, key, ctx)
        finally:
            queue.done(key)


def _watched(namespaces: Sequence[str]) -> Sequence[str | None]:
    """Where to list: each watched namespace, or the whole cluster (None)."""
    return list(namespaces) or [None]


def resync_keys(namespaces: Sequence[str] = ()) -> list[Key]:
    """Every TrainingRun and Environment to reconcile again, listed per watched namespace
    (a namespaced operator may not list cluster-wide)."""
    keys: list[Key] = []
    for kind, (res, _) in _RECONCILERS.items():
        for namespace in _watched(namespaces):
            try:
                items = k8s.list_(res, namespace)
            except k8s.ApiError as err:
                logger.warning("resync of %s in %s failed: %s", res.plural, namespace, err)
                continue
            keys += [(kind, o["metadata"]["namespace"], o["metadata"]["name"]) for o in items]
    return keys


async def _resync(queue: WorkQueue) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(RESYNC_SECONDS)
        keys = await loop.run_in_executor(None, resync_keys, sorted(queue.namespaces))
        for key in keys:
            queue.add(key)


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    """Kopf uses the same credentials as torchyard.k8s (kubeconfig or in-cluster). The
    bearer token comes through ``k8s.connection``, which knows where the client keeps it
    and refreshes an expiring one (in a Pod: the projected ServiceAccount token); Kopf
    calls this again when the apiserver answers 401."""
    cfg = k8s.load().configuration
    token = k8s.connection().bearer_token
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
    settings.execution.max_workers = WORKERS + 4
    queue = WorkQueue(memo.get("namespaces", ()))
    telemetry.reset_run_phases()
    ctx = reconcile.Context(settings=_settings())
    memo.queue = queue
    memo.tasks = [asyncio.create_task(_worker(queue, ctx)) for _ in range(WORKERS)]
    memo.tasks.append(asyncio.create_task(_resync(queue)))


@kopf.on.cleanup()
async def stop_workers(memo: kopf.Memo, **_: Any) -> None:
    for task in memo.get("tasks", []):
        task.cancel()


def _enqueue(memo: Any, kind: str, namespace: str | None, name: str) -> None:
    queue = memo.get("queue")
    if queue is not None and namespace:
        queue.add((kind, namespace, name))


@kopf.on.event(api.GROUP, api.VERSION, "trainingruns")
async def trainingrun_event(
    type: str, name: str, namespace: str | None, status: Mapping[str, Any], memo: Any, **_: Any
) -> None:
    if namespace:
        phase = None if type == "DELETED" else str((status or {}).get("phase") or "")
        telemetry.run_phase(namespace, name, phase)
    if type != "DELETED":
        _enqueue(memo, "TrainingRun", namespace, name)


@kopf.on.event(api.GROUP, api.VERSION, "environments")
async def environment_event(
    type: str, name: str, namespace: str | None, memo: Any, **_: Any
) -> None:
    if type != "DELETED":
        _enqueue(memo, "Environment", namespace, name)


@kopf.on.event("", "v1", "pods", labels={names.LABEL_RUN: kopf.PRESENT})
async def pod_event(labels: Mapping[str, str], namespace: str | None, memo: Any, **_: Any) -> None:
    _enqueue(memo, "TrainingRun", namespace, labels[names.LABEL_RUN])


def release_pods_of_lost_node(node: str, namespaces: Sequence[str] = ()) -> list[tuple[str, str]]:
    """Delete torchyard's Pods bound to a deleted node at once (PodGC would take a while),
    only in the watched namespaces: returns the (namespace, run) of each. A Warning
    ``NodeLost`` Event on each Pod's TrainingRun names the node (the run's status names
    the Pod, which is gone by then)."""
    lost = [
        pod
        for namespace in _watched(namespaces)
        for pod in k8s.list_(
            k8s.PODS,
            namespace,
            label_selector=names.LABEL_RUN,
            field_selector=f"spec.nodeName={node}",
        )
    ]
    runs = []
    for pod in lost:
        meta = pod["metadata"]
        k8s.delete(k8s.PODS, meta["namespace"], meta["name"], grace_period_seconds=0)
        runs.append((meta["namespace"], meta["labels"][names.LABEL_RUN]))
        _record_node_lost(pod, node)
    return runs


def _record_node_lost(pod: Mapping[str, Any], node: str) -> None:
    """The Event on the Pod's TrainingRun (its controller owner) that names the node."""
    meta = pod["metadata"]
    owner = next(
        (
            o
            for o in meta.get("ownerReferences", [])
            if o.get("controller") and o.get("kind") == "TrainingRun"
        ),
        None,
    )
    if owner is None:
        return
    run = {
        "apiVersion": owner.get("apiVersion"),
        "kind": "TrainingRun",
        "metadata": {"name": owner["name"], "namespace": meta["namespace"], "uid": owner["uid"]},
    }
    rank = meta.get("labels", {}).get(names.LABEL_NODE_RANK, "?")
    message = f"node {node} was deleted: node Pod {meta['name']} (node rank {rank}) is lost with it"
    k8s.record_event(run, "Warning", "NodeLost", message, now=timestamp(reconcile.utcnow()))


@kopf.on.event("", "v1", "nodes")
async def node_event(type: str, name: str, memo: Any, **_: Any) -> None:
    if type != "DELETED":
        return
    loop = asyncio.get_running_loop()
    queue = memo.get("queue")
    namespaces = sorted(queue.namespaces) if queue is not None else []
    try:
        runs = await loop.run_in_executor(None, release_pods_of_lost_node, name, namespaces)
    except k8s.ApiError as err:
        logger.warning("node %s deleted, but its Pods could not be released: %s", name, err)
        return
    for namespace, run in runs:
        logger.warning(
            "node %s is gone: its Pod of TrainingRun %s/%s is lost", name, namespace, run
        )
        _enqueue(memo, "TrainingRun", namespace, run)


@kopf.on.event("batch", "v1", "jobs", labels={"app.kubernetes.io/component": "environment-build"})
async def build_job_event(namespace: str | None, memo: Any, **_: Any) -> None:
    """A build Job changed: reconcile the Environments of its namespace (few, cheap)."""
    if not namespace:
        return
    loop = asyncio.get_running_loop()
    try:
        envs = await loop.run_in_executor(None, k8s.list_, k8s.ENVIRONMENTS, namespace)
    except k8s.ApiError:
        return
    for env in envs:
        _enqueue(memo, "Environment", namespace, env["metadata"]["name"])
