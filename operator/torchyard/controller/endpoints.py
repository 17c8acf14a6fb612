"""The OnlineEndpoint reconcile: its Environment and model, the model's files in the
inputs cache, then its Deployments and Service (or KServe's InferenceService), and the
status once.

:func:`reconcile` reads top to bottom: parse the spec; what it waits for outside it (the
Environment ready, the model version pinned: the spec's, or the one a Sweep's
registerBest registered; KServe's CRD for backend KServe; a registry service to check
callers' tokens unless public; a ConfigMap source, whose content hash rolls the Pods when
it changes); each served version's entry in the inputs cache (``inputs.prepare_sources``:
the fetch Job checks every file against the version's manifest); then the children by
server-side apply (``planning.endpoints``), those of another backend or a finished canary
deleted; the serving Pods listed for their failures; and the status written once
(``status.endpoints``). Called by the work queue (``workqueue``); tested against the
in-memory fake in tests/unit/controller/test_endpoints.py and a real control plane in
tests/integration/test_endpoints.py.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torchyard import api, k8s
from torchyard.controller import context
from torchyard.controller import inputs as cache
from torchyard.controller.context import Context, Log, Outcome, Result
from torchyard.planning import endpoints as plans
from torchyard.planning import names
from torchyard.status import endpoints as endpoint_status

# While it waits for something outside it (a Sweep's model, KServe), look again this often.
WAIT_SECONDS = 30.0
# While Pods come up or roll, look again this often (Deployment and Pod events come sooner).
ROLLING_SECONDS = 10.0


@dataclass
class Seen:
    """What one reconcile observed outside the serving part."""

    image: str = ""
    python: str = "python3"
    model: tuple[str, int] | None = None
    source_sha256: str = ""
    waiting: tuple[str, str] | None = None
    failed: tuple[str, str] | None = None
    notes: list[str] = field(default_factory=list)


def reconcile(body: Mapping[str, Any], logger: Log, ctx: Context) -> Result:
    """Reconcile one OnlineEndpoint (see the module docstring)."""
    previous = body.get("status") or {}
    now = ctx.clock()
    try:
        ep = api.parse_endpoint(dict(body))
    except api.InvalidSpec as err:
        logger.warning("OnlineEndpoint %s is invalid: %s", body["metadata"]["name"], err)
        new = endpoint_status.invalid_endpoint_status(
            body["metadata"].get("generation"), str(err), previous, now
        )
        context.write(ctx, body, Outcome(new, now, context.phase_events(previous, new)))
        return Result()
    seen = _outside(ep, ctx)
    observed = _serve(ep, seen, previous, logger, ctx, now)
    new = endpoint_status.endpoint_status(ep, observed, previous, now)
    context.write(ctx, body, Outcome(new, now, context.phase_events(previous, new)))
    phase = new.get("phase")
    if phase in ("Pending",):
        return Result(requeue_after=WAIT_SECONDS)
    if phase in ("Deploying", "Updating", "Preparing"):
        return Result(requeue_after=ROLLING_SECONDS)
    return Result()


def _outside(ep: api.OnlineEndpoint, ctx: Context) -> Seen:
    """The Environment, the model version, KServe, the registry and the source."""
    seen = Seen()
    ns = ep.namespace
    env = ctx.k8s.get_or_none(k8s.ENVIRONMENTS, ns, ep.spec.environment)
    env_status = (env or {}).get("status") or {}
    if env is None:
        seen.waiting = ("EnvironmentNotFound", f"Environment {ep.spec.environment} does not exist")
    elif env_status.get("phase") == "Failed":
        why = env_status.get("message") or "its build failed"
        seen.failed = ("EnvironmentFailed", f"Environment {ep.spec.environment} failed: {why}")
    elif env_status.get("phase") != "Ready" or not env_status.get("image"):
        seen.waiting = ("EnvironmentNotReady", f"Environment {ep.spec.environment} is not ready")
    else:
        seen.image = str(env_status["image"])
        seen.python = str((env.get("spec") or {}).get("python") or "python3")
    seen.model = _model(ep, ctx, seen)
    if (
        ep.spec.backend == "KServe"
        and ctx.k8s.get_or_none(k8s.CRDS, None, k8s.INFERENCESERVICES_CRD) is None
    ):
        seen.waiting = seen.waiting or (
            "KServeNotInstalled",
            f"backend KServe needs KServe's CRD {k8s.INFERENCESERVICES_CRD}: install KServe, "
            "or set backend Deployment",
        )
    if not ep.spec.public and not ctx.settings.registry_url:
        seen.failed = seen.failed or (
            "NoRegistry",
            "this endpoint is not public, and its callers' tokens are checked by the registry "
            "service, which this operator has none of: enable the chart's registry, or set "
            "spec.public: true",
        )
    taken = _service_taken(ep, ctx)
    if taken is not None:
        seen.waiting = seen.waiting or ("ServiceNameTaken", taken)
    if ep.spec.source.config_map is not None:
        cm = ctx.k8s.get_or_none(k8s.CONFIGMAPS, ns, ep.spec.source.config_map)
        if cm is None:
            seen.waiting = seen.waiting or (
                "ConfigMapNotFound",
                f"source.configMap {ep.spec.source.config_map} does not exist",
            )
        else:
            seen.source_sha256 = _content_hash(cm)
    return seen


def _service_taken(ep: api.OnlineEndpoint, ctx: Context) -> str | None:
    """Why the endpoint's Service (its scoring URI's host, the endpoint's name) cannot be
    its own: a Service of that name that this endpoint does not own, e.g. a TrainingRun's
    headless one (a run of the same name); None when it is free or the endpoint's."""
    name = names.endpoint_service(ep.name)
    found = ctx.k8s.get_or_none(k8s.SERVICES, ep.namespace, name)
    if found is None:
        return None
    owners = found.get("metadata", {}).get("ownerReferences") or []
    # its own, or its InferenceService's (KServe names that one's Service after it too)
    mine = ("OnlineEndpoint", "InferenceService")
    if any(o.get("kind") in mine and o.get("name") == ep.name for o in owners):
        return None
    whose = ", ".join(f"{o.get('kind')} {o.get('name')}" for o in owners) or "no OnlineEndpoint"
    return (
        f"Service {name} (the scoring URI's host) already exists and belongs to {whose}: "
        "delete it or rename the endpoint; the endpoint waits until the name is free"
    )


def _model(ep: api.OnlineEndpoint, ctx: Context, seen: Seen) -> tuple[str, int] | None:
    """The model version to serve: the spec's, or what the Sweep registered."""
    pinned = ep.spec.model.name_and_version
    if pinned is not None:
        return pinned
    name = str(ep.spec.model.sweep)
    sweep = ctx.k8s.get_or_none(k8s.SWEEPS, ep.namespace, name)
    registered = ((sweep or {}).get("status") or {}).get("model") or {}
    if registered.get("name") and registered.get("version"):
        return str(registered["name"]), int(registered["version"])
    phase = ((sweep or {}).get("status") or {}).get("phase")
    if phase in ("Succeeded", "Failed"):
        seen.failed = seen.failed or (
            "NoModelRegistered",
            f"Sweep {name} ended ({phase}) without registering a model: set its "
            "spec.registerBest, or name a model version in model.uri",
        )
    else:
        what = "does not exist" if sweep is None else "has not registered its best model yet"
        seen.waiting = seen.waiting or ("ModelNotRegistered", f"Sweep {name} {what}")
    return None


def _content_hash(cm: Mapping[str, Any]) -> str:
    content = {"data": cm.get("data") or {}, "binaryData": cm.get("binaryData") or {}}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:32]


def _serve(
    ep: api.OnlineEndpoint,
    seen: Seen,
    previous: Mapping[str, Any],
    logger: Log,
    ctx: Context,
    now: Any,
) -> endpoint_status.EndpointObserved:
    """The model in the cache, then the children applied and observed."""
    base = endpoint_status.EndpointObserved(
        waiting=seen.waiting, failed=seen.failed, model=seen.model
    )
    if seen.failed or seen.waiting or seen.model is None:
        return base
    model, version = seen.model
    plan = plans.tracks(ep, version)
    wanted = [
        (plans.model_input(ep, model, t.version), plans.model_source(ep, model, t.version))
        for t in plan
    ]
    fetched = cache.prepare_sources(ctx, ep.namespace, wanted, previous, logger, now)
    observed = endpoint_status.EndpointObserved(model=seen.model, inputs=fetched)
    if fetched is not None and not fetched.ready:
        return observed
    keys = {t.version: source.key for t, (_, source) in zip(plan, wanted, strict=True)}
    parts = {
        t.version: plans.PodInputs(
            model, seen.image, keys[t.version], ctx.settings, seen.python, seen.source_sha256
        )
        for t in plan
    }
    if ep.spec.backend == "KServe":
        loads = _kserve(ep, plan[0], parts[plan[0].version], ctx, logger)
    else:
        loads = _deployments(ep, plan, parts, ctx, logger)
    pods = ctx.k8s.list_(k8s.PODS, ep.namespace, label_selector=f"{names.LABEL_ENDPOINT}={ep.name}")
    return endpoint_status.EndpointObserved(
        model=seen.model,
        inputs=fetched,
        workloads=loads,
        pods=pods,
        scoring_uri=plans.scoring_uri(ep),
    )


def _deployments(
    ep: api.OnlineEndpoint,
    plan: list[plans.Track],
    parts: Mapping[int, plans.PodInputs],
    ctx: Context,
    logger: Log,
) -> list[endpoint_status.Workload]:
    """The Service, a Deployment per track and the autoscaler, applied; a track no longer
    planned (a canary promoted or dropped) and another backend's children deleted."""
    ctx.k8s.apply(plans.service(ep))
    shares = plans.shares(plan)
    loads = []
    for track in plan:
        manifest = plans.deployment(ep, track, parts[track.version])
        applied = ctx.k8s.apply(manifest)
        name = manifest["metadata"]["name"]
        loads.append(
            endpoint_status.deployment_workload(
                track.name,
                track.version,
                shares[track.version],
                name,
                track.replicas,
                applied,
                parts[track.version].key,
            )
        )
    planned = {names.endpoint_deployment(ep.name, t.name) for t in plan}
    _delete_others(ctx, ep, k8s.DEPLOYMENTS, planned, logger)
    scaler = plans.autoscaler(ep)
    if scaler is not None:
        ctx.k8s.apply(scaler)
    _delete_others(ctx, ep, k8s.HORIZONTALPODAUTOSCALERS, {ep.name} if scaler else set(), logger)
    if ctx.k8s.get_or_none(k8s.CRDS, None, k8s.INFERENCESERVICES_CRD) is not None:
        _delete_others(ctx, ep, k8s.INFERENCESERVICES, set(), logger)
    return loads


def _kserve(
    ep: api.OnlineEndpoint,
    track: plans.Track,
    parts: plans.PodInputs,
    ctx: Context,
    logger: Log,
) -> list[endpoint_status.Workload]:
    """The InferenceService, applied (torchyard's own Deployments and Service deleted);
    its Pods, labelled as torchyard's, say how far it is."""
    ns = ep.namespace
    applied = ctx.k8s.apply(plans.inference_service(ep, track, parts))
    for res in (k8s.DEPLOYMENTS, k8s.SERVICES, k8s.HORIZONTALPODAUTOSCALERS):
        _delete_others(ctx, ep, res, set(), logger)
    pods = ctx.k8s.list_(k8s.PODS, ns, label_selector=f"{names.LABEL_ENDPOINT}={ep.name}")
    ready = sum(1 for p in pods if _ready(p))
    conditions = (applied.get("status") or {}).get("conditions") or []
    rolled = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    scaling = ep.spec.autoscaling
    desired = scaling.min_replicas if scaling is not None else ep.spec.replicas
    return [
        endpoint_status.Workload(
            "primary", track.version, 100, ep.name, desired, ready, ready, rolled, parts.key
        )
    ]


def _ready(pod: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _delete_others(
    ctx: Context, ep: api.OnlineEndpoint, res: k8s.Resource, keep: set[str], logger: Log
) -> None:
    """Delete ``ep``'s children of kind ``res`` (by its label and owner) but ``keep``."""
    selector = f"{names.LABEL_ENDPOINT}={ep.name}"
    uid = str(ep.metadata.get("uid", ""))
    for child in ctx.k8s.list_(res, ep.namespace, label_selector=selector):
        meta = child.get("metadata", {})
        owners = {o.get("uid") for o in meta.get("ownerReferences") or []}
        if meta.get("name") in keep or (uid and uid not in owners):
            continue
        if ctx.k8s.delete(res, ep.namespace, meta["name"]):
            logger.info(
                "deleted %s %s/%s: no longer part of the endpoint",
                res.plural,
                ep.namespace,
                meta["name"],
            )
