"""The Kopf handlers: they put keys on the work queue (``workqueue``) and feed the cache.

Kopf watches TrainingRuns, Sweeps, Environments, OnlineEndpoints and their serving
Deployments, build and fetch Jobs, Nodes and Kueue's Workloads (where Kueue is
installed); each event puts the
key of the object to reconcile on the queue (a trial TrainingRun's, its Sweep's key too),
whose workers call the reconcilers. The Pods are watched outside Kopf (``pod_watch``,
started here): a Pod's event queues its run on the status lane without waiting behind
Kopf's per-object workers. So the operator is level-triggered and keeps no state of its
own on user objects (no finalizers, no annotations). No handler calls the apiserver or
acts on an object: a deleted or down Node queues the runs with Pods on it, whose
reconcile releases the Pods of a deleted one (``lost_nodes``); a build Job queues the
Environments of its namespace as the watch holds them (``reads``). The Pod and Node
events also feed the cache gang admission decides over (``cache``; other Pods that hold
GPUs are watched for it too), primed by one list at start-up; when what admission sees
changed, :func:`admission_loop` runs an admission pass (``admission.run_pass``) and
queues the runs it admitted or moved in their pool's queue. An event that only brings
back this operator's own write (a run's status, a Pod it created: same resourceVersion)
queues nothing. The held reads (``reads``) get every TrainingRun from an index handler,
which Kopf runs for each listed run before any event handler: once an event handler runs,
a Sweep's trials are read from them. With ``controller.operators`` the only module that
imports kopf.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping
from typing import Any

import kopf

from torchyard import api, k8s
from torchyard.api import wire
from torchyard.api.quantities import quantity
from torchyard.controller import (
    admission,
    context,
    pod_watch,
    reads,
    recording,
    telemetry,
    workqueue,
)
from torchyard.launch.contract import (
    TORCHYARD_GIT_IMAGE,
    TORCHYARD_INIT_IMAGE,
    TORCHYARD_INPUTS_ACCESS_MODE,
    TORCHYARD_INPUTS_CACHE_LIMIT,
    TORCHYARD_INPUTS_CACHE_SIZE,
    TORCHYARD_INPUTS_STORAGE_CLASS,
    TORCHYARD_KUEUE_INTEGRATION,
    TORCHYARD_MLFLOW_SECRET,
    TORCHYARD_MLFLOW_URI,
    TORCHYARD_REGISTRY_CA_FILE,
    TORCHYARD_REGISTRY_TOKEN_FILE,
    TORCHYARD_REGISTRY_URL,
    TORCHYARD_RESOLVE_CURATED,
)
from torchyard.planning import inputs as run_inputs
from torchyard.planning import names, pods
from torchyard.planning import tracking as run_tracking
from torchyard.status import exclusions
from torchyard.status import sweeps as sweep_status
from torchyard.tuning import sweep_trials

# Work queue workers: a reconcile mostly waits on the apiserver (a new run's is about six
# calls), so more of them than cores; 16 phased a queue of 1000 runs in 55 s where 8 took
# 73 s on the same loaded 2-core machine (benchmarks/scale.py).
WORKERS = 16
# Workers that serve only the status lane (a run's own Pods changed, its gang admitted),
# so that a status write never waits for one of the others to finish a new run.
STATUS_WORKERS = 4
# After the first event of a burst, the admission pass waits this long for the rest.
ADMISSION_DEBOUNCE_SECONDS = 0.02
# How long the runs an admission pass moved in their queue wait when it also admitted a
# run (``after_pass``): their new place is shown a moment later, the gang is placed first.
MOVED_DELAY_SECONDS = 2.0
# How long a trial's change waits to queue its Sweep when all the Sweep does then is keep
# its books (``_sweep_delay``).
SETTLED_SWEEP_DELAY_SECONDS = 2.0
logger = logging.getLogger("torchyard.controller")


def _settings(memo: Any) -> pods.Settings:
    """The builders' settings: the operator's options (``operators.run`` puts them in the
    memo) and the TORCHYARD_* variables the chart sets."""
    return pods.Settings(
        log_limit_bytes=memo.get("log_limit_bytes"),
        init_image=os.environ.get(TORCHYARD_INIT_IMAGE, pods.Settings.init_image),
        git_image=os.environ.get(TORCHYARD_GIT_IMAGE, pods.Settings.git_image),
        resolve_curated=os.environ.get(TORCHYARD_RESOLVE_CURATED, "all"),
        registry_url=os.environ.get(TORCHYARD_REGISTRY_URL, ""),
        registry_token_file=os.environ.get(TORCHYARD_REGISTRY_TOKEN_FILE, ""),
        registry_ca=_registry_ca(os.environ.get(TORCHYARD_REGISTRY_CA_FILE, "")),
        inputs_cache=_inputs_cache(),
        tracking=run_tracking.Settings(
            uri=os.environ.get(TORCHYARD_MLFLOW_URI, ""),
            secret=os.environ.get(TORCHYARD_MLFLOW_SECRET, ""),
        ),
        kueue_integration=_kueue_integration(os.environ.get(TORCHYARD_KUEUE_INTEGRATION, "")),
    )


def _kueue_integration(value: str) -> str:
    """The chart's kueue.integration: auto (the default), workload or podGroups."""
    if value in ("", "auto", "workload", "podGroups"):
        return value or "auto"
    raise RuntimeError(
        f"{TORCHYARD_KUEUE_INTEGRATION}={value!r}: must be auto, workload or podGroups (the "
        "chart's kueue.integration)"
    )


def _inputs_cache() -> run_inputs.CacheSettings:
    """The namespaces' inputs caches (the chart's ``inputs.cache``): the claim's size,
    storage class and access mode, and the limit its entries are kept under (by default
    nine tenths of the claim)."""
    size = os.environ.get(TORCHYARD_INPUTS_CACHE_SIZE, run_inputs.CacheSettings.size)
    limit = os.environ.get(TORCHYARD_INPUTS_CACHE_LIMIT, "")
    return run_inputs.CacheSettings(
        size=size,
        limit_bytes=int(quantity(limit)) if limit else int(quantity(size) * 9 // 10),
        storage_class=os.environ.get(TORCHYARD_INPUTS_STORAGE_CLASS, ""),
        access_mode=os.environ.get(
            TORCHYARD_INPUTS_ACCESS_MODE, run_inputs.CacheSettings.access_mode
        ),
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
            f"{TORCHYARD_REGISTRY_CA_FILE}: cannot read the registry's CA certificate: {err}"
        ) from None


@kopf.on.login()
def login(memo: Any, **_: Any) -> kopf.ConnectionInfo:
    """Kopf uses the operator's own credentials (``memo.k8s``, a ``k8s.Client``: in a Pod
    its ServiceAccount's, else the kubeconfig's). The bearer token comes through
    ``Client.connection``, which knows where the client keeps it and refreshes an expiring
    one (in a Pod: the projected ServiceAccount token); Kopf calls this again when the
    apiserver answers 401."""
    client: k8s.Client = memo.k8s
    cfg = client.api.configuration
    token = client.connection().bearer_token
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        token=token,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
    )


KOPF_OBJECTS = logging.getLogger("kopf.objects")


class _HandlerSucceeded(logging.Filter):
    """Drops Kopf's per-event "Handler '...' succeeded." lines; keeps everything else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and str(record.msg).endswith(" succeeded."))


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = f"{api.GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=api.GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    # Kopf logs "Handler 'node_event' succeeded." for every watch event: thousands a minute
    # with a full queue, and all of them say nothing (the handlers only queue keys).
    if not any(isinstance(f, _HandlerSucceeded) for f in KOPF_OBJECTS.filters):
        KOPF_OBJECTS.addFilter(_HandlerSucceeded())
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.execution.max_workers = WORKERS + STATUS_WORKERS + 4
    queue = workqueue.WorkQueue(memo.get("namespaces", ()))
    telemetry.reset_run_phases()
    # Runs, Environments and a run's Pods are read from what the watches delivered.
    client: k8s.Client = memo.k8s  # the operator's own credentials (controller.operators)
    held = reads.WatchedReads(client, tuple(sorted(queue.namespaces)))
    memo.reads = held
    ctx = context.Context(settings=_settings(memo), k8s=held)
    # The watches start after the start-up handlers: what they deliver is newer than this.
    try:
        await asyncio.get_running_loop().run_in_executor(None, admission.prime, ctx)
    except k8s.ApiError as err:
        raise kopf.TemporaryError(
            f"gang admission needs the cluster's Nodes and Pods, and listing them failed "
            f"({err}); the operator's ServiceAccount needs list and watch on nodes and pods "
            "cluster-wide (the chart's ClusterRole grants them); retrying",
            delay=10,
        ) from err
    memo.queue = queue
    memo.ctx = ctx
    memo.sweep_reads = {}  # (namespace, trial) -> sweep_trials.sweep_reads of its last event
    # (namespace, sweep) -> status.sweeps.keeps_books_only of its last event
    memo.settled_sweeps = {}
    memo.endpoints_preparing = set()  # (namespace, endpoint) waiting for its model's fetch
    memo.admission_wake = asyncio.Event()
    memo.admission_wake.set()
    memo.tasks = [asyncio.create_task(workqueue.worker(queue, ctx)) for _ in range(WORKERS)]
    memo.tasks += [
        asyncio.create_task(workqueue.worker(queue, ctx, workqueue.STATUS))
        for _ in range(STATUS_WORKERS)
    ]
    memo.tasks.append(asyncio.create_task(admission_loop(queue, ctx, memo.admission_wake)))
    if queue.namespaces:
        memo.tasks.append(
            asyncio.create_task(outside_refresh(ctx, sorted(queue.namespaces), memo.admission_wake))
        )
    memo.tasks.append(asyncio.create_task(workqueue.resync(queue, client)))
    memo.pod_watch = _start_pod_watch(client, queue, ctx, memo.reads, memo.admission_wake)


def _start_pod_watch(
    client: k8s.Client,
    queue: workqueue.WorkQueue,
    ctx: context.Context,
    held: reads.WatchedReads,
    wake: asyncio.Event,
) -> pod_watch.PodWatch:
    """The Pod watch outside Kopf (``pod_watch``): its threads hand each chunk of events
    to the held reads (``reads``: a run's Pods), then to this event loop, which feeds the
    cache and queues the runs."""
    loop = asyncio.get_running_loop()

    def hand_over(events: list[pod_watch.Event]) -> None:
        held.pods_seen(events)  # before the run is queued: its reconcile reads them
        with contextlib.suppress(RuntimeError):  # a closed loop: the operator is stopping
            loop.call_soon_threadsafe(pod_watch.deliver, ctx, queue, wake, events)

    watch = pod_watch.PodWatch(client, sorted(queue.namespaces), hand_over)
    held.pods_listed = watch.listed  # a run's Pods are read from it once it listed them
    watch.start()
    return watch


@kopf.on.cleanup()
async def stop_workers(memo: kopf.Memo, **_: Any) -> None:
    for task in memo.get("tasks", []):
        task.cancel()
    watch = memo.get("pod_watch")
    if watch is not None:
        await asyncio.get_running_loop().run_in_executor(None, watch.stop)


async def admission_loop(
    queue: workqueue.WorkQueue, ctx: context.Context, wake: asyncio.Event
) -> None:
    """An admission pass each time ``wake`` is set, a few milliseconds after the first
    event of a burst so that the burst makes one pass (events that come during a pass
    make one more); the runs it admitted or moved are queued."""
    loop = asyncio.get_running_loop()
    while True:
        await wake.wait()
        await asyncio.sleep(ADMISSION_DEBOUNCE_SECONDS)  # one pass for a burst of events
        wake.clear()
        try:
            passed = await loop.run_in_executor(None, admission.run_pass, ctx)
        except Exception:  # a bug: say it loudly, and try again on the next event
            logger.exception("the admission pass failed")
            continue
        for key, delay, lane in after_pass(passed):
            queue.add(key, delay, lane)


def after_pass(passed: admission.Passed) -> list[tuple[context.Key, float, int]]:
    """What an admission pass queues, (key, delay, lane): the runs it admitted at once on
    the status lane (their reconcile lifts their gates), then those it moved in their
    queue on the background lane (a new ``status.queue.position``), ``MOVED_DELAY_SECONDS``
    later when it admitted a run: a freed slot moves up to 50 waiting runs, and their
    status writes would take the CPU the admitted gang's reconcile needs."""
    delay = MOVED_DELAY_SECONDS if passed.admitted else 0.0
    return [
        *((key, 0.0, workqueue.STATUS) for key in passed.admitted),
        *((key, delay, workqueue.BACKGROUND) for key in passed.moved),
    ]


async def outside_refresh(ctx: context.Context, namespaces: list[str], wake: asyncio.Event) -> None:
    """A namespaced operator's view of the Pods in the other namespaces, listed again
    every ``admission.OUTSIDE_REFRESH_SECONDS`` (its watches do not see them)."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(admission.OUTSIDE_REFRESH_SECONDS)
        try:
            changed = await loop.run_in_executor(None, admission.refresh_outside, ctx, namespaces)
        except k8s.ApiError as err:
            logger.warning("the Pods outside the watched namespaces could not be listed: %s", err)
            continue
        if changed:
            wake.set()


def _cache_event(memo: Any, kind: str, type_: str | None, body: Mapping[str, Any]) -> None:
    """Hand a watch event to the admission cache and wake the pass (which takes it in,
    and decides only when admission sees a change)."""
    ctx, wake = memo.get("ctx"), memo.get("admission_wake")
    if ctx is None or wake is None:
        return
    ctx.cache.feed(kind, type_, body)
    wake.set()


def _enqueue(
    memo: Any,
    kind: str,
    namespace: str | None,
    name: str,
    lane: int = workqueue.EVENTS,
    delay: float = 0.0,
) -> None:
    queue = memo.get("queue")
    if queue is not None and namespace:
        queue.add((kind, namespace, name), delay, lane)


def _own_write(memo: Any, key: context.Key, meta: Mapping[str, Any]) -> bool:
    """The event brings back this operator's own status write (its resourceVersion):
    the reconcile that wrote it saw everything it holds."""
    ctx = memo.get("ctx")
    version = meta.get("resourceVersion")
    return ctx is not None and bool(version) and ctx.written.get(key) == version


def _seen(memo: Any, res: k8s.Resource, type_: str | None, body: Mapping[str, Any]) -> None:
    held = memo.get("reads")
    if held is not None:
        held.seen(res, type_, dict(body))


@kopf.index(api.GROUP, api.VERSION, "trainingruns")
async def trainingrun_held(body: Mapping[str, Any], memo: Any, **_: Any) -> None:
    """Each TrainingRun event but a deletion hands the run to the held reads (``reads``;
    ``trainingrun_event`` hands over the deletions), and indexes nothing. As an index
    handler it runs for every run Kopf's watch listed before any event handler runs, so
    the first event handler may say that the held runs are complete
    (:func:`_runs_listed`): a Sweep's trials are read from them from then on."""
    _seen(memo, k8s.TRAININGRUNS, None, body)


def _runs_listed(memo: Any) -> None:
    held = memo.get("reads")
    if held is not None and not held.runs_listed.is_set():
        held.runs_listed.set()


def _gone(kind: str | None) -> bool:
    """Whether a watch event's type says the object was deleted."""
    return kind == "DELETED"


@kopf.on.event(api.GROUP, api.VERSION, "trainingruns")
async def trainingrun_event(
    type: str,
    name: str,
    namespace: str | None,
    meta: Mapping[str, Any],
    status: Mapping[str, Any],
    body: Mapping[str, Any],
    memo: Any,
    **_: Any,
) -> None:
    _runs_listed(memo)
    if _gone(type):
        _seen(memo, k8s.TRAININGRUNS, type, body)  # the others came by trainingrun_held
    sweep = (meta.get("labels") or {}).get(wire.LABEL_SWEEP)
    if sweep and _trial_changed(memo, type, namespace, name, body):
        _enqueue(memo, "Sweep", namespace, str(sweep), delay=_sweep_delay(memo, namespace, sweep))
    if namespace:
        phase = None if _gone(type) else str((status or {}).get("phase") or "")
        telemetry.run_phase(namespace, name, phase)
    if _gone(type):
        _deleted(memo, "TrainingRun", namespace, name, body)
    elif not _own_write(memo, ("TrainingRun", namespace or "", name), meta):
        _enqueue(memo, "TrainingRun", namespace, name)


def _sweep_delay(memo: Any, namespace: str | None, sweep: str) -> float:
    """How soon a trial's change queues its Sweep (which reads its trials' status): at
    once, but ``SETTLED_SWEEP_DELAY_SECONDS`` later for a sweep whose last status said its
    next reconcile only keeps its books (``status.sweeps.keeps_books_only``: every trial made, none
    paused), so that the gang admitted into the slot a trial freed is placed first, and
    the burst of its trials' events is one reconcile."""
    settled = memo.get("settled_sweeps") or {}
    return SETTLED_SWEEP_DELAY_SECONDS if settled.get((namespace or "", sweep)) else 0.0


def _trial_changed(
    memo: Any, type_: str | None, namespace: str | None, name: str, body: Mapping[str, Any]
) -> bool:
    """Whether a trial's event changed what its Sweep reads of it (the operator's own
    writes included; a deleted or first-seen trial always): a trial moving up the queue
    does not queue a Sweep that would list all its trials for nothing."""
    held = memo.get("sweep_reads")
    key = (namespace or "", name)
    if held is None or type_ == "DELETED":
        if held is not None:
            held.pop(key, None)
        return True
    digest = sweep_trials.sweep_reads(body)
    if held.get(key) == digest:
        return False
    held[key] = digest
    return True


def _deleted(
    memo: Any, kind: str, namespace: str | None, name: str, body: Mapping[str, Any]
) -> None:
    """A TrainingRun or Sweep is gone: forget its writes, and record what its last event
    held unless it was recorded (``recording.deleted``, in a thread, not awaited)."""
    ctx = memo.get("ctx")
    if ctx is None:
        return
    ctx.written.pop((kind, namespace, name), None)
    if recording.needs_recording(ctx, body):
        asyncio.get_running_loop().run_in_executor(None, recording.deleted, ctx, dict(body))


@kopf.on.event(api.GROUP, api.VERSION, "sweeps")
async def sweep_event(
    type: str,
    name: str,
    namespace: str | None,
    meta: Mapping[str, Any],
    body: Mapping[str, Any],
    memo: Any,
    **_: Any,
) -> None:
    settled = memo.get("settled_sweeps")
    if settled is not None:
        done = not _gone(type) and sweep_status.keeps_books_only(body.get("status"))
        settled[(namespace or "", name)] = done
    if _gone(type):
        _deleted(memo, "Sweep", namespace, name, body)
    elif not _own_write(memo, ("Sweep", namespace or "", name), meta):
        _enqueue(memo, "Sweep", namespace, name)
    _runs_listed(memo)


@kopf.on.event(api.GROUP, api.VERSION, "onlineendpoints")
async def endpoint_event(
    type: str,
    name: str,
    namespace: str | None,
    meta: Mapping[str, Any],
    status: Mapping[str, Any],
    memo: Any,
    **_: Any,
) -> None:
    """An OnlineEndpoint changed: queue it (not for its own status write); remember which
    wait for a model fetch (``input_fetch_event`` queues them)."""
    preparing = memo.get("endpoints_preparing")
    if preparing is not None:
        key = (namespace or "", name)
        if type != "DELETED" and (status or {}).get("phase") in (None, "Pending", "Preparing"):
            preparing.add(key)
        else:
            preparing.discard(key)
    if type == "DELETED":
        ctx = memo.get("ctx")
        if ctx is not None:
            ctx.written.pop(("OnlineEndpoint", namespace, name), None)
    elif not _own_write(memo, ("OnlineEndpoint", namespace or "", name), meta):
        _enqueue(memo, "OnlineEndpoint", namespace, name)


@kopf.on.event("apps", "v1", "deployments", labels={"app.kubernetes.io/component": "serving"})
async def serving_deployment_event(
    namespace: str | None, labels: Mapping[str, str], memo: Any, **_: Any
) -> None:
    """A serving Deployment's rollout moved: queue its endpoint."""
    endpoint = labels.get(names.LABEL_ENDPOINT)
    if endpoint:
        _enqueue(memo, "OnlineEndpoint", namespace, endpoint, workqueue.STATUS)


@kopf.on.event(api.GROUP, api.VERSION, "environments")
async def environment_event(
    type: str, name: str, namespace: str | None, body: Mapping[str, Any], memo: Any, **_: Any
) -> None:
    _seen(memo, k8s.ENVIRONMENTS, type, body)
    if not _gone(type):
        _enqueue(memo, "Environment", namespace, name)


def _runs_on(memo: Any, node: str) -> list[tuple[str, str]]:
    """The (namespace, run) of torchyard's unfinished Pods on ``node``, as the cache holds
    them."""
    ctx = memo.get("ctx")
    if ctx is None:
        return []
    runs = {
        (p["metadata"].get("namespace"), p["metadata"].get("labels", {}).get(names.LABEL_RUN))
        for p in ctx.cache.pods()
        if p.get("spec", {}).get("nodeName") == node
    }
    return sorted(r for r in runs if r[0] and r[1])


@kopf.on.event("", "v1", "nodes")
async def node_event(
    type: str | None, name: str, body: Mapping[str, Any], memo: Any, **_: Any
) -> None:
    """A deleted Node, or one that says it is NotReady or unhealthy: queue the runs with
    unfinished Pods on it. Their reconcile releases the Pods of a deleted Node
    (``lost_nodes``) and fails the attempt on a down one at once
    (``exclusions.down_failure``), not after the taint manager's eviction."""
    _cache_event(memo, "Node", type, body)
    if _gone(type) or exclusions.unhealthy(body) is not None:
        for namespace, run in _runs_on(memo, name):
            _enqueue(memo, "TrainingRun", namespace, run)


@kopf.on.event(k8s.KUEUE_GROUP, k8s.KUEUE_VERSION, "workloads")
async def workload_event(
    type: str | None, namespace: str | None, body: Mapping[str, Any], memo: Any, **_: Any
) -> None:
    """A Kueue Workload changed (admitted, evicted, finished): queue the TrainingRun it is
    for (its run label, or its owner: MultiKueue's copy on a worker), on the status lane
    (an admission is a gang to place at once; controller/workloads.py)."""
    run = workload_run(body)
    if run is not None and type != "DELETED":
        _enqueue(memo, "TrainingRun", namespace, run, lane=workqueue.STATUS)


@kopf.on.event("apiextensions.k8s.io", "v1", "customresourcedefinitions", field="spec.group",
               value=k8s.KUEUE_GROUP)  # fmt: skip
async def kueue_crd_event(memo: Any, **_: Any) -> None:
    """Kueue installed, upgraded or removed: what it offers is read again
    (``workloads.served``, ``workloads.topologies``)."""
    ctx = memo.get("ctx")
    if ctx is not None:
        ctx.kueue.clear()


@kopf.on.event(k8s.KUEUE_GROUP, k8s.KUEUE_VERSION, "topologies")
async def topology_event(memo: Any, **_: Any) -> None:
    """A Kueue Topology changed: the levels of the runs' placements are read again."""
    ctx = memo.get("ctx")
    if ctx is not None:
        ctx.kueue.pop("topologies", None)


def workload_run(body: Mapping[str, Any]) -> str | None:
    """The name of the TrainingRun a Workload is for, None when it is not a run's."""
    meta = body.get("metadata") or {}
    for owner in meta.get("ownerReferences") or []:
        if owner.get("kind") == "TrainingRun" and owner.get("apiVersion") == api.API_VERSION:
            return str(owner.get("name"))
    run = (meta.get("labels") or {}).get(names.LABEL_RUN)
    return str(run) if run else None


@kopf.on.event("batch", "v1", "jobs", labels={"app.kubernetes.io/component": "environment-build"})
async def build_job_event(namespace: str | None, memo: Any, **_: Any) -> None:
    """A build Job changed: queue the Environments of its namespace (few, cheap), as the
    watch delivered them (``reads``): Environments of one recipe share a Job."""
    held = memo.get("reads")
    if held is None or not namespace:
        return
    for env in held.names(k8s.ENVIRONMENTS, namespace):
        _enqueue(memo, "Environment", namespace, env)


# The phases of a run whose gang has no Pods yet, so its inputs may still be fetched.
WAITS_FOR_INPUTS = (None, api.Phase.PENDING, api.Phase.PREPARING)


@kopf.on.event("batch", "v1", "jobs", labels={"app.kubernetes.io/component": "input-fetch"})
async def input_fetch_event(namespace: str | None, memo: Any, **_: Any) -> None:
    """A fetch Job changed: queue the namespace's runs with inputs that are not yet
    running, as the watch delivered them (``reads``)."""
    held = memo.get("reads")
    if held is None or not namespace:
        return
    for run in held.held(k8s.TRAININGRUNS, namespace):
        phase = (run.get("status") or {}).get("phase")
        if run.get("spec", {}).get("inputs") and phase in WAITS_FOR_INPUTS:
            _enqueue(memo, "TrainingRun", namespace, run["metadata"]["name"])
    for ns, endpoint in sorted(memo.get("endpoints_preparing") or ()):
        if ns == namespace:
            _enqueue(memo, "OnlineEndpoint", namespace, endpoint)
