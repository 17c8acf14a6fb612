"""A run with ``scheduling.queueName`` in the reconcile: its Kueue Workload, followed as
Kueue's job framework follows a job's.

``trainingruns`` asks :func:`mode` which way a queued run goes: through a Workload
torchyard makes (``workload``: the chart's ``kueue.integration``, or ``auto`` when the
cluster's Kueue serves Workload ``v1beta2``) or as plain Pod groups Kueue's Pod
integration admits (the fallback, ``admission``). Through a Workload:

- :func:`observe` reads it (None: not made yet);
- :func:`admit` is the "apply children" step: it creates the Workload (owned by the run;
  its PodSets, priority and topology request from ``planning.workloads``), says why the
  gang waits while Kueue has not admitted it (Kueue's own message), and once Kueue has,
  creates the node Pods with the admission applied: the flavors' node labels and
  tolerations and, under topology-aware scheduling, each Pod's domain, node ranks domain
  by domain. The copy of a run MultiKueue made on a worker cluster uses the Workload
  MultiKueue made for it (:func:`adopt`);
- an evicted Workload (preempted, deactivated, a node failure) restarts the gang as a
  suspension (``failure_policy``: its Pods are stopped gracefully, so their ranks save a
  just-in-time checkpoint), and once its Pods are gone :func:`release` clears the
  admission, as the job framework does: Kueue queues it again;
- :func:`suspend` deactivates it while ``spec.suspend`` holds (Kueue evicts it and keeps
  it out of its queue) and :func:`release` frees its quota once the Pods are gone;
- :func:`finish` marks it ``Finished`` when the run ends (its quota is released).

Called by ``trainingruns`` and ``suspension``; tested in
tests/unit/controller/test_workloads.py and against a real Kueue in
tests/integration/test_kueue.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from torchyard import api, k8s
from torchyard.controller import admission, context
from torchyard.controller.context import Context, Log
from torchyard.planning import admission as gangs
from torchyard.planning import pods, topology, workloads

# How long what the cluster's Kueue offers (its Workload version, its Topologies) is
# trusted before it is read again.
KUEUE_REFRESH_SECONDS = 60.0
# How soon a run waiting for MultiKueue's Workload (a worker's copy) is looked at again.
PREBUILT_RETRY_SECONDS = 2.0


def _cached(ctx: Context, key: str, read: Any) -> Any:
    now = ctx.clock()
    held = ctx.kueue.get(key)
    if held is None or (now - held[0]).total_seconds() >= KUEUE_REFRESH_SECONDS:
        held = (now, read())
        ctx.kueue[key] = held
    return held[1]


def served(ctx: Context) -> bool:
    """The cluster's Kueue serves Workload ``v1beta2`` (read once a minute)."""

    def read() -> bool:
        crd = ctx.k8s.get_or_none(k8s.CRDS, None, k8s.WORKLOADS_CRD)
        versions = (crd or {}).get("spec", {}).get("versions") or []
        return any(v.get("name") == k8s.KUEUE_VERSION and v.get("served") for v in versions)

    return bool(_cached(ctx, "workloads", read))


def mode(ctx: Context, run: api.TrainingRun) -> str | None:
    """How the run goes to Kueue: "workload", "podGroups", or None (no queueName)."""
    if not run.spec.scheduling.queue_name:
        return None
    chosen = ctx.settings.kueue_integration
    if chosen in ("workload", "podGroups"):
        return chosen
    return "workload" if served(ctx) else "podGroups"


def topologies(ctx: Context) -> list[dict[str, Any]]:
    """Kueue's Topology objects (none when Kueue is not installed), read once a minute."""

    def read() -> list[dict[str, Any]]:
        try:
            return ctx.k8s.list_(k8s.TOPOLOGIES)
        except k8s.ApiError as err:
            if err.not_found:  # no Kueue, or one without Topology v1beta2
                return []
            raise

    found: list[dict[str, Any]] = _cached(ctx, "topologies", read)
    return found


def request(ctx: Context, run: api.TrainingRun) -> topology.Request | None:
    """The run's ``spec.placement`` with the levels above it (Kueue's Topology)."""
    if run.spec.placement is None:
        return None
    return topology.request(run.spec.placement, topologies(ctx))


def observe(ctx: Context, run: api.TrainingRun) -> dict[str, Any] | None:
    """The run's Workload, None when there is none (yet)."""
    return ctx.k8s.get_or_none(k8s.WORKLOADS, run.namespace, workloads.name(run))


def create(ctx: Context, run: api.TrainingRun, logger: Log) -> dict[str, Any] | None:
    """Create the run's Workload (None: MultiKueue makes it, and has not yet)."""
    if workloads.prebuilt(run):
        return None
    priority = None
    if run.spec.compute.priority_class_name:
        found = ctx.k8s.get_or_none(k8s.PRIORITYCLASSES, None, run.spec.compute.priority_class_name)
        priority = int((found or {}).get("value") or 0)
    manifest = workloads.workload(
        run, run.spec.distribution.node_count, priority=priority, request=request(ctx, run)
    )
    try:
        made = ctx.k8s.create(manifest, field_manager=k8s.FIELD_MANAGER)
    except k8s.ApiError as err:
        if not err.conflict:
            raise
        return ctx.k8s.get_or_none(k8s.WORKLOADS, run.namespace, workloads.name(run))
    logger.info(
        "TrainingRun %s/%s: Workload %s created in LocalQueue %s",
        run.namespace,
        run.name,
        manifest["metadata"]["name"],
        run.spec.scheduling.queue_name,
    )
    return made


def adopt(ctx: Context, run: api.TrainingRun, wl: Mapping[str, Any]) -> None:
    """Own the Workload MultiKueue made for this copy of a run (a worker cluster)."""
    patch = workloads.adoption(wl, run)
    if patch is not None:
        meta = wl["metadata"]
        ctx.k8s.merge_patch(k8s.WORKLOADS, meta["namespace"], meta["name"], patch)


def admit(
    ctx: Context,
    run: api.TrainingRun,
    wl: Mapping[str, Any] | None,
    node_pods: Callable[[], list[dict[str, Any]]],
    current: list[dict[str, Any]],
    result: context.Result,
    logger: Log,
    now: datetime,
    *,
    resuming: bool = False,
) -> admission.Admission:
    """The Kueue path of "apply children": the Workload made (or adopted), the gang's
    Pods created once Kueue admitted it (``node_pods`` builds the node Pods, only then;
    ``current``: those that exist); what the status says while it waits. ``resuming``:
    the run was suspended until now: its Workload is made active again (one that Kueue or
    an administrator deactivated otherwise stays so, and the run says why it waits)."""
    queue = run.spec.scheduling.queue_name or ""
    if wl is None:
        wl = create(ctx, run, logger)
        if wl is None:
            result.requeue_after = PREBUILT_RETRY_SECONDS
            message = f"waiting for MultiKueue's Workload {workloads.name(run)}"
            return admission.Admission(current, gangs.Decision(False, 0, message))
    elif workloads.prebuilt(run):
        adopt(ctx, run, wl)
    if resuming and not workloads.active(wl):
        ctx.k8s.apply(workloads.activation(wl, True))  # queued again
    if workloads.evicted(wl) or not workloads.admitted(wl):
        if workloads.evicted(wl) and not current:
            release(ctx, wl, now)  # the gang is gone: Kueue may queue it again
        message = workloads.waiting_message(wl, queue)
        return admission.Admission(current, gangs.Decision(False, 0, message))
    return _create_admitted(ctx, run, wl, node_pods(), current)


def _create_admitted(
    ctx: Context,
    run: api.TrainingRun,
    wl: Mapping[str, Any],
    wanted: list[dict[str, Any]],
    current: list[dict[str, Any]],
) -> admission.Admission:
    """The missing node Pods of a gang Kueue admitted, each placed as its admission says."""
    have = {p["metadata"]["name"] for p in current}
    missing = [(i, p) for i, p in enumerate(wanted) if p["metadata"]["name"] not in have]
    placed = placements(ctx, run, wl)
    message = f"admitted by Kueue's ClusterQueue {workloads.cluster_queue(wl)}" + _where(
        ctx, run, placed
    )
    pods_ = [_placed(p, placed[i], message) for i, p in missing if i < len(placed)]
    if pods_:
        admission.ship(ctx, run.namespace)
        ctx.k8s.apply(pods.service(run))
        admission.create_pods(ctx, run.namespace, pods_)
    size = run.spec.distribution.node_count
    return admission.Admission(current + pods_, gangs.Decision(True, size, message))


def placements(
    ctx: Context, run: api.TrainingRun, wl: Mapping[str, Any]
) -> list[workloads.Placement]:
    """Each node rank's placement under the Workload's admission (its flavors read)."""
    flavors = {
        name: found
        for name in workloads.flavors_of(wl)
        if (found := ctx.k8s.get_or_none(k8s.RESOURCEFLAVORS, None, name)) is not None
    }
    labels = {
        str(n["metadata"]["name"]): dict(n["metadata"].get("labels") or {})
        for n in ctx.cache.nodes()
    }
    return workloads.placements(
        wl, run.spec.distribution.node_count, flavors, labels, request(ctx, run)
    )


def _placed(pod: dict[str, Any], placement: workloads.Placement, note: str) -> dict[str, Any]:
    out = pods.ungate(pod, placement.node_selector, placement.tolerations, note)
    meta = dict(out["metadata"])
    meta["labels"] = {**meta.get("labels", {}), **placement.labels}
    meta["annotations"] = {**meta.get("annotations", {}), **placement.annotations}
    return {**out, "metadata": meta}


def _where(ctx: Context, run: api.TrainingRun, placed: Sequence[workloads.Placement]) -> str:
    """Where the gang went, by its placement's level (a host's read from its Node)."""
    if run.spec.placement is None:
        return ""
    level = run.spec.placement.topology.level
    labels = {
        str(n["metadata"]["name"]): n["metadata"].get("labels") or {} for n in ctx.cache.nodes()
    }
    values = []
    for p in placed:
        host = p.node_selector.get(topology.HOSTNAME_LEVEL, "")
        values.append(p.node_selector.get(level) or labels.get(host, {}).get(level) or host)
    return topology.describe(level, values)


def release(ctx: Context, wl: Mapping[str, Any], now: datetime) -> None:
    """Clear an evicted Workload's admission once the gang's Pods are gone (Kueue queues
    it again; a deactivated one stays out of its queue until it is active again). A
    Workload that changed meanwhile (409) is left for the next reconcile."""
    if not workloads.reserved(wl):
        return
    meta = wl["metadata"]
    try:
        ctx.k8s.merge_patch(
            k8s.WORKLOADS,
            meta["namespace"],
            meta["name"],
            workloads.requeue_patch(wl, now),
            subresource="status",
        )
    except k8s.ApiError as err:
        if not (err.conflict or err.not_found):
            raise


def suspend(ctx: Context, wl: Mapping[str, Any] | None, stopping: int, now: datetime) -> None:
    """``spec.suspend``: the Workload deactivated (Kueue evicts it), and its quota released
    once no node Pod is left (``stopping`` is how many still stop)."""
    if wl is None:
        return
    if workloads.active(wl):
        ctx.k8s.apply(workloads.activation(wl, False))
    elif not stopping and workloads.evicted(wl):
        release(ctx, wl, now)


def finish(
    ctx: Context, wl: Mapping[str, Any] | None, phase: str, message: str, now: datetime
) -> None:
    """Mark the Workload of a run that ended ``Finished`` (its quota is released)."""
    if wl is None or workloads.finished(wl):
        return
    succeeded = phase == api.Phase.SUCCEEDED.value
    try:
        ctx.k8s.apply_status(workloads.finished_status(wl, succeeded, message, now))
    except k8s.ApiError as err:
        if not err.not_found:  # gone with the run
            raise
