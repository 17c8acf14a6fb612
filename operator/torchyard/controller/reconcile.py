"""Reconcilers: fetch children -> failure policy -> create children -> admit -> status.

Plain functions over a resource body (JobSet's ``reconcile()`` as a story), called by the
work queue in ``handlers.py``. Children come from the pure builders in
``torchyard.planning``, are server-side applied with one field manager, and only when
missing (the observed state already says whether they exist); status comes from
``torchyard.status`` and is patched only when it changed. A spec the apiserver let
through but torchyard cannot run is reported in status once, not retried. Every phase
change is also an Event on the object, and the counters of ``telemetry`` move here.
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import threading
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from torchyard import api, envbuild, k8s, status
from torchyard.controller import telemetry
from torchyard.planning import admission, environments, models, names, pods
from torchyard.status.trainingruns import (
    TERMINAL,
    Observed,
    archive_failures,
    first_failure,
    lost_failure,
    settling,
)

Clock = Callable[[], datetime]
Log = logging.Logger | logging.LoggerAdapter[Any]
SERVICE_ACCOUNT_RETRY_SECONDS = 10.0
_ADMISSION_LOCK = threading.Lock()
_POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="torchyard-apply")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class Result:
    """What the work queue should do next with this object."""

    requeue_after: float | None = None
    also: list[tuple[str, str, str]] = field(default_factory=list)  # other keys to reconcile


@dataclass(frozen=True)
class Context:
    settings: pods.Settings = field(default_factory=pods.Settings)
    clock: Clock = utcnow


def _status_manifest(body: Mapping[str, Any], new_status: dict[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    return {
        "apiVersion": body["apiVersion"],
        "kind": body["kind"],
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "status": new_status,
    }


def _patch_status_if_changed(body: Mapping[str, Any], new_status: dict[str, Any]) -> bool:
    """Apply ``new_status`` unless the object already shows exactly that; True when written."""
    if dict(body.get("status") or {}) == new_status:
        return False
    k8s.apply_status(_status_manifest(body, new_status))
    return True


def _record_phase_change(
    body: Mapping[str, Any], previous: Mapping[str, Any], new: Mapping[str, Any], now: datetime
) -> None:
    """An Event when the phase changed (after the status that says so was written)."""
    event = status.phase_event(previous, new)
    if event is not None:
        type_, reason, message = event
        k8s.record_event(dict(body), type_, reason, message, now=status.timestamp(now))


def _parallel(fn: Callable[[Any], Any], items: Iterable[Any]) -> None:
    for future in [_POOL.submit(fn, item) for item in items]:
        future.result()


def _ts(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def _attempt(pod: Mapping[str, Any]) -> int:
    return int(pod["metadata"].get("labels", {}).get(pods.ATTEMPT_LABEL, "0"))


def _live(pod: Mapping[str, Any]) -> bool:
    return pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")


def _delete_pods(namespace: str, victims: Iterable[Mapping[str, Any]]) -> None:
    _parallel(
        lambda p: k8s.delete(k8s.PODS, namespace, p["metadata"]["name"], grace_period_seconds=5),
        [p for p in victims if not p["metadata"].get("deletionTimestamp")],
    )


# -- Environments -----------------------------------------------------------------------


def environment(body: Mapping[str, Any], logger: Log, ctx: Context) -> Result:
    """Reconcile one Environment; the runs waiting on it are reconciled next."""
    previous = body.get("status") or {}
    generation = body["metadata"].get("generation")
    ns = body["metadata"]["namespace"]
    now = ctx.clock()
    build = None
    try:
        env = api.parse_environment(dict(body))
    except api.InvalidSpec as err:
        logger.warning("Environment %s is invalid: %s", body["metadata"]["name"], err)
        new = status.invalid_environment_status(generation, str(err), previous, now)
    else:
        if env.spec.image is not None:
            build = _resolve_curated(env.spec.image, ctx)
        else:
            build = _build(env, ns, logger, ctx)
        new = status.environment_status(env, previous, now, build)
    changed = _patch_status_if_changed(body, new)
    _record_phase_change(body, previous, new, now)
    if new.get("phase") != previous.get("phase"):
        _count_build(new, build)
    result = Result()
    if changed and new.get("phase") in ("Ready", "Failed"):
        name = body["metadata"]["name"]
        for run in k8s.list_(k8s.TRAININGRUNS, ns):
            if run.get("spec", {}).get("environment") == name:
                result.also.append(("TrainingRun", ns, run["metadata"]["name"]))
    if new.get("phase") == "Building":
        result.requeue_after = 30.0  # Job events wake us sooner
    return result


def _count_build(new: Mapping[str, Any], build: status.BuildObserved | None) -> None:
    """Build metrics, once per Environment phase change: a cache hit, or a build that ended."""
    ready = status.find(new.get("conditions"), "Ready") or {}
    reason = ready.get("reason")
    if reason == "Cached":
        telemetry.CACHE_HITS.inc()
        return
    if build is None or not build.job or reason not in ("Built", "BuildFailed", "ImageMissing"):
        return
    result = "succeeded" if reason == "Built" else "failed"
    telemetry.BUILDS.inc(result=result)
    if build.job_seconds is not None:
        telemetry.BUILD_SECONDS.observe(build.job_seconds, result=result)


def _resolve_curated(image: str, ctx: Context) -> status.BuildObserved | None:
    """A curated image's digest when its registry answers (else the image as given)."""
    if "@sha256:" in image:
        return None
    host, repo, tag = envbuild.parse_reference(image)
    if not ctx.settings.resolves(host):
        return None
    try:
        digest = envbuild.Registry(host, timeout=5).manifest_digest(repo, tag)
    except envbuild.BuildError:
        return None
    if not digest:
        return None
    name = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    return status.BuildObserved(hash="", image=f"{name}@{digest}")


def _registry_auth(env: api.Environment, ns: str) -> dict[str, Any]:
    secret_name = env.spec.registry.push_secret if env.spec.registry else None
    if not secret_name:
        return {}
    secret = k8s.get_or_none(k8s.SECRETS, ns, secret_name) or {}
    raw = secret.get("data", {}).get(".dockerconfigjson")
    if not raw:
        return {}
    try:
        data: dict[str, Any] = json.loads(base64.b64decode(raw))
    except ValueError:
        return {}
    return data


def _build(env: api.Environment, ns: str, logger: Log, ctx: Context) -> status.BuildObserved:
    """Is the image there? Else make sure its one build Job exists, and read its state."""
    assert env.spec.registry is not None
    hash_ = environments.content_hash(env)
    target = environments.target(env, hash_)
    host, repo, tag = envbuild.parse_reference(target)
    registry_error = ""
    image = None
    try:
        client = envbuild.Registry(
            host, _registry_auth(env, ns), insecure=env.spec.registry.insecure or None, timeout=10
        )
        digest = client.manifest_digest(repo, tag)
        if digest:
            image = f"{env.spec.registry.repository.rstrip('/')}@{digest}"
    except envbuild.BuildError as err:
        registry_error = str(err)
    name = environments.job_name(env, hash_)
    job = k8s.get_or_none(k8s.JOBS, ns, name)
    if image is not None:
        state = _job_state(job) if job else ""
        return status.BuildObserved(
            hash_,
            image=image,
            job=name if job else None,
            job_state=state,
            job_seconds=_job_seconds(job),
        )
    if job is None:
        recipe = environments.recipe_configmap(env, hash_)
        if recipe is not None:
            k8s.apply(recipe)
        job = k8s.apply(environments.build_job(env, hash_, ctx.settings))
        logger.info(
            "Environment %s/%s: building %s in Job %s", ns, env.metadata.get("name"), target, name
        )
    state = _job_state(job)
    message = _explain(_job_failure(ns, name), env.spec.python) if state == "Failed" else ""
    return status.BuildObserved(
        hash_,
        job=name,
        job_state=state,
        job_message=message,
        registry_error=registry_error,
        job_seconds=_job_seconds(job),
    )


def _job_state(job: Mapping[str, Any] | None) -> str:
    for cond in (job or {}).get("status", {}).get("conditions", []) or []:
        if cond.get("status") == "True" and cond.get("type") in ("Complete", "Failed"):
            return str(cond["type"])
    return "Running"


def _job_seconds(job: Mapping[str, Any] | None) -> float | None:
    """How long a build Job ran: start to completion (or to its Failed condition)."""
    st = (job or {}).get("status", {})
    end = st.get("completionTime")
    for cond in st.get("conditions", []) or []:
        if cond.get("type") == "Failed" and cond.get("status") == "True":
            end = end or cond.get("lastTransitionTime")
    start, stop = _ts(st.get("startTime")), _ts(end)
    if start is None or stop is None:
        return None
    return max(0.0, (stop - start).total_seconds())


def _job_failure(ns: str, job: str) -> str:
    """The builder's error (its JSON termination message) or the tail of its log."""
    for pod in k8s.list_(k8s.PODS, ns, label_selector=f"job-name={job}"):
        for cs in pod.get("status", {}).get("containerStatuses", []) or []:
            term = (cs.get("state") or {}).get("terminated") or {}
            message = term.get("message") or ""
            if not message and term.get("reason") in ("StartError", "ContainerCannotRun"):
                message = str(term.get("reason"))
            if not message:
                continue
            try:
                return str(json.loads(message).get("error") or message)
            except (ValueError, AttributeError):
                return str(message)
    return "the build Job failed without a message (see its Pod's log)"


def _explain(message: str, python: str) -> str:
    """Turn what the kubelet says about a builder that cannot start into advice."""
    if "executable file not found" in message or "no such file or directory" in message:
        return (
            f"the base image has no {python}: the builder runs in the base image, so "
            f"use a base image with Python, or set spec.python to its interpreter "
            f"({message.strip()})"
        )
    return message


# -- TrainingRuns -----------------------------------------------------------------------


def trainingrun(body: Mapping[str, Any], logger: Log, ctx: Context) -> Result:
    """Reconcile one TrainingRun (see the module docstring)."""
    meta = body["metadata"]
    ns, name, uid = meta["namespace"], meta["name"], meta.get("uid")
    previous = dict(body.get("status") or {})
    now = ctx.clock()
    try:
        run = api.parse_trainingrun(dict(body))
        if run.spec.source.snapshot and not ctx.settings.registry_url:
            raise api.InvalidSpec(
                "source.snapshot needs the model registry service, and this operator has "
                "none (install the chart with the registry, or set TORCHYARD_REGISTRY_URL); "
                "or submit a folder under ~900 KiB, which goes into a ConfigMap"
            )
    except api.InvalidSpec as err:
        logger.warning("TrainingRun %s is invalid: %s", name, err)
        new = status.invalid_trainingrun_status(meta.get("generation"), str(err), previous, now)
        _patch_status_if_changed(body, new)
        _record_phase_change(body, previous, new, now)
        return Result()

    if meta.get("deletionTimestamp"):
        return Result()  # being deleted: owner references take the children away

    # 1. Fetch the children: this run's Pods (not a namesake's that was deleted).
    children = [
        p
        for p in k8s.list_(k8s.PODS, ns, label_selector=f"{names.LABEL_RUN}={name}")
        if any(o.get("uid") == uid for o in p["metadata"].get("ownerReferences", []))
    ]

    # 2. Finished: clean up, then nothing else to do.
    if previous.get("phase") in TERMINAL:
        return _finished(run, body, children, previous, now)

    attempt = int(previous.get("restarts") or 0)
    current = [p for p in children if _attempt(p) == attempt]
    stale = [p for p in children if _attempt(p) != attempt]
    observed = Observed(
        environment=k8s.get_or_none(k8s.ENVIRONMENTS, ns, run.spec.environment),
        pods=current,
        restarts=attempt,
        failed_attempts=int(previous.get("failedAttempts") or 0),
    )
    env_phase = (observed.environment or {}).get("status", {}).get("phase")
    result = Result()

    # 3. Deadline and failure policy.
    start = _ts(previous.get("startTime"))
    deadline = run.spec.policy.active_deadline_seconds
    if deadline and start is not None:
        left = (start + timedelta(seconds=deadline) - now).total_seconds()
        if left <= 0:
            observed = _replace(observed, deadline_exceeded=True)
        else:
            result.requeue_after = left
    failure = first_failure(current)
    if failure is not None and not observed.deadline_exceeded:
        wait = settling(failure, current, now)
        if wait is not None:
            # Its peers on the other nodes may yet report an earlier exit: decide (and
            # stop them) once they did or the settle time is over.
            logger.debug("TrainingRun %s/%s: a node failed; deciding in %.1fs", ns, name, wait)
            return Result(requeue_after=wait)
    if failure is None and previous.get("phase") == api.Phase.RUNNING.value:
        pod_names = [names.pod(name, i) for i in range(run.spec.distribution.node_count)]
        failure = lost_failure(pod_names, current)
    if failure is not None and not observed.deadline_exceeded:
        restart = _restart_decision(run, failure, previous)
        if restart is not None:
            return _restart(run, body, current, previous, failure, restart, logger, now)
        failure = _final(run, failure, previous)
        observed = _replace(observed, failure=failure)

    # 4. Create what is missing (Service + Pods), gated; never while an old attempt lingers.
    if env_phase == "Ready" and failure is None and not observed.deadline_exceeded:
        if stale:
            _delete_pods(ns, stale)
            result.requeue_after = 1.0
        else:
            env_status = (observed.environment or {}).get("status", {})
            env_spec = (observed.environment or {}).get("spec", {})
            image = str(env_status.get("image") or env_spec.get("image") or "")
            python = str(env_spec.get("python") or "python3")
            wanted = pods.pods(
                run, image=image, python=python, attempt=attempt, settings=ctx.settings
            )
            try:
                current, decision, others = _create_and_admit(run, wanted, current)
            except k8s.ApiError as err:
                if err.status == 403 and _no_service_account(err.message):
                    # The run waits for it (its creation sends this operator no event).
                    observed = _replace(observed, pending=_service_account_missing(run))
                    result.requeue_after = SERVICE_ACCOUNT_RETRY_SECONDS
                    decision, others = None, []
                elif err.status == 403 and "PodSecurity" in err.message:
                    # The namespace's policy refuses these Pods: no retry can help, say why.
                    message = (
                        f"the namespace's Pod Security admission refused the node Pods "
                        f"({err.message}); set spec.runAsUser (e.g. 1000, the curated "
                        "images' user) to run them as non-root"
                    )
                    logger.warning("TrainingRun %s/%s: %s", ns, name, message)
                    new = status.invalid_trainingrun_status(
                        meta.get("generation"), message, previous, now
                    )
                    _patch_status_if_changed(body, new)
                    _record_phase_change(body, previous, new, now)
                    return Result()
                else:
                    raise
            result.also.extend(others)
            if decision is not None and decision.admit:
                logger.info("TrainingRun %s/%s admitted: %s", ns, name, decision.message)
                created = _ts(str(meta.get("creationTimestamp") or ""))
                if attempt == 0 and created is not None:
                    wait = max(0.0, (now - created).total_seconds())
                    telemetry.ADMISSION_WAIT_SECONDS.observe(wait)
            elif decision is not None:
                observed = _replace(observed, queued_message=decision.message)
            observed = _replace(observed, pods=current)

    # 6. Finalizing: register the outputs once every node succeeded (and node 0's outputs
    # were archived: with outputs.optional a node may succeed without them).
    total = run.spec.distribution.node_count
    if (
        run.spec.outputs.register_ is not None
        and len(current) == total
        and all(p.get("status", {}).get("phase") == "Succeeded" for p in current)
        and 0 not in archive_failures(current)
    ):
        model, message = _register(run, observed.environment, ctx, logger)
        observed = _replace(
            observed,
            finalized=model is not None or not message,
            model=model,
            finalizing_message=message,
        )
        if model is None and message:
            result.requeue_after = 5.0

    # 7. Status, and what a failure means for the surviving ranks.
    new = status.trainingrun_status(run, observed, previous, now)
    if new.get("phase") == api.Phase.FAILED.value and previous.get("phase") != new["phase"]:
        _delete_pods(ns, [p for p in current if _live(p)])
        logger.warning("TrainingRun %s/%s failed: %s", ns, name, _event_message(new))
    _patch_status_if_changed(body, new)
    _record_phase_change(body, previous, new, now)
    _warn_archive_failed(body, previous, new, now)
    if new.get("phase") in TERMINAL and run.spec.policy.ttl_seconds_after_finished is not None:
        result.requeue_after = float(run.spec.policy.ttl_seconds_after_finished) + 0.5
    if new.get("phase") in TERMINAL:
        result.also.extend(_waiting_runs())
    return result


def _register(
    run: api.TrainingRun, environment: Mapping[str, Any] | None, ctx: Context, logger: Log
) -> tuple[dict[str, Any] | None, str]:
    """Promote the run's outputs in the registry service and record a ModelVersion.

    Returns ({name, version}, "") when done, (None, why) while it cannot be done yet, and
    (None, "") when no registry service is configured (nothing to wait for).
    """
    reg = run.spec.outputs.register_
    assert reg is not None
    url = ctx.settings.registry_url
    if not url:
        logger.warning(
            "TrainingRun %s/%s: outputs.register is set but no registry service "
            "is configured (TORCHYARD_REGISTRY_URL)",
            run.namespace,
            run.name,
        )
        return None, ""
    dist = run.spec.distribution
    image = str(((environment or {}).get("status") or {}).get("image") or "")
    body = {
        "run": run.name,
        "path": reg.path,
        "metadata": {
            "run": {"name": run.name, "uid": str(run.metadata.get("uid", ""))},
            "environmentImage": image,
            "command": list(run.spec.command),
            "nodeCount": dist.node_count,
            "processCountPerNode": dist.process_count_per_node,
        },
    }
    try:
        with open(ctx.settings.registry_token_file) as f:
            token = f.read().strip()
        req = urllib.request.Request(
            f"{url.rstrip('/')}/v1/namespaces/{run.namespace}/models/{reg.model}/versions",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
        )
        # An https registry is verified with the CA the chart mounts (or the system's).
        context = (
            ssl.create_default_context(cadata=ctx.settings.registry_ca)
            if ctx.settings.registry_ca
            else None
        )
        with urllib.request.urlopen(req, timeout=60, context=context) as resp:
            manifest = json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return None, f"the registry refused the promotion: {err.code} {err.read()[:300]!r}"
    except (OSError, ValueError) as err:
        return None, f"the registry service is not reachable: {err}"
    files = manifest.get("files", [])
    primary = next((f for f in files if f["path"].endswith(".pt")), files[0] if files else {})
    mv = k8s.apply(
        models.model_version(
            run.namespace,
            reg.model,
            manifest,
            run=run.name,
            run_uid=str(run.metadata.get("uid", "")),
            command=list(run.spec.command),
            image=image,
        )
    )
    available = status.modelversion_status(
        len(files),
        str(manifest.get("size", "")),
        manifest.get("created"),
        mv.get("metadata", {}).get("generation"),
        ctx.clock(),
    )
    if status.find((mv.get("status") or {}).get("conditions"), "Available") is None:
        k8s.apply_status(
            {
                "apiVersion": api.API_VERSION,
                "kind": "ModelVersion",
                "metadata": {"name": mv["metadata"]["name"], "namespace": run.namespace},
                "status": available,
            }
        )
    logger.info(
        "TrainingRun %s/%s registered %s version %s (%s sha256 %s)",
        run.namespace,
        run.name,
        reg.model,
        manifest["version"],
        primary.get("path"),
        primary.get("sha256"),
    )
    return {"name": reg.model, "version": manifest["version"]}, ""


def _replace(observed: Observed, **changes: Any) -> Observed:
    from dataclasses import replace

    return replace(observed, **changes)


def _event_message(new_status: Mapping[str, Any]) -> str:
    for cond in new_status.get("conditions", []):
        if cond["type"] == "Failed":
            return str(cond.get("message", ""))
    return ""


def _restart_decision(
    run: api.TrainingRun, failure: Mapping[str, Any], previous: Mapping[str, Any]
) -> str | None:
    """'platform' or 'user' when the gang should be restarted, None when the run fails.
    Platform failures use policy.platformRestartLimit, the user's code backoffLimit; a
    stuck Pod or a failed archive upload is never restarted (training again won't help)."""
    restarts = int(previous.get("restarts") or 0)
    used = int(previous.get("failedAttempts") or 0)
    if failure.get("platform"):
        limit = run.spec.policy.platform_restart_limit
        return "platform" if restarts - used < limit else None
    if failure.get("reason") in status.trainingruns.NOT_RESTARTED:
        return None
    return "user" if used < run.spec.policy.backoff_limit else None


def _no_service_account(message: str) -> bool:
    """The apiserver's ServiceAccount admission refused a Pod whose ServiceAccount is
    missing ("error looking up service account NS/NAME: serviceaccount "NAME" not found")."""
    text = message.lower()
    return "service account" in text and "not found" in text


def _service_account_missing(run: api.TrainingRun) -> tuple[str, str]:
    sa, ns = run.spec.service_account_name, run.namespace
    return (
        "ServiceAccountNotFound",
        f"the node Pods run as ServiceAccount {sa} (spec.serviceAccountName), which does not "
        f"exist in namespace {ns}: create it (kubectl create serviceaccount {sa} -n {ns}) "
        "or name one that exists; the run waits for it",
    )


def _final(
    run: api.TrainingRun, failure: dict[str, Any], previous: Mapping[str, Any]
) -> dict[str, Any]:
    """The failure that ends the run: a platform one says that no restart was left."""
    if not failure.get("platform"):
        return failure
    limit = run.spec.policy.platform_restart_limit
    used = int(previous.get("restarts") or 0) - int(previous.get("failedAttempts") or 0)
    left = f"no platform restart left ({used} of policy.platformRestartLimit {limit} used)"
    message = str(failure.get("message") or "").strip()
    return {**failure, "message": f"{message}; {left}" if message else left}


def _warn_archive_failed(
    body: Mapping[str, Any], previous: Mapping[str, Any], new: Mapping[str, Any], now: datetime
) -> None:
    """A run that succeeded without all of its archive (outputs.optional): a Warning."""
    archived = status.find(new.get("conditions"), "OutputsArchived")
    if archived is None or archived.get("status") != "False":
        return
    if new.get("phase") == previous.get("phase"):
        return
    if new.get("phase") not in (api.Phase.SUCCEEDED.value, api.Phase.FINALIZING.value):
        return
    if previous.get("phase") == api.Phase.FINALIZING.value:
        return  # said when it began finalizing
    message = str(archived.get("message") or "")
    k8s.record_event(dict(body), "Warning", "ArchiveFailed", message, now=status.timestamp(now))


def _restart(
    run: api.TrainingRun,
    body: Mapping[str, Any],
    current: list[dict[str, Any]],
    previous: dict[str, Any],
    failure: Mapping[str, Any],
    kind: str,
    logger: Log,
    now: datetime,
) -> Result:
    """Restart the whole gang: delete this attempt's Pods, count, create the next one."""
    ns = run.namespace
    _delete_pods(ns, current)
    restarts = int(previous.get("restarts") or 0) + 1
    used = int(previous.get("failedAttempts") or 0) + (1 if kind == "user" else 0)
    why = status.trainingruns.failure_message(failure)
    if kind == "platform":
        counted = "a platform failure, not counted against backoffLimit"
    else:
        counted = f"{used}/{run.spec.policy.backoff_limit} of backoffLimit used"
    message = f"restarting the gang (restart {restarts}, {counted}): {why}"
    new = status.restarting_status(previous, run.generation, restarts, used, message, now)
    logger.warning("TrainingRun %s/%s: %s", ns, run.name, message)
    _patch_status_if_changed(body, new)
    # The phase goes back to Pending: this Event says why (instead of a "Pending" one).
    k8s.record_event(dict(body), "Warning", "Restarting", message, now=status.timestamp(now))
    return Result(requeue_after=0.5)


def _finished(
    run: api.TrainingRun,
    body: Mapping[str, Any],
    children: list[dict[str, Any]],
    previous: Mapping[str, Any],
    now: datetime,
) -> Result:
    ns = run.namespace
    _delete_pods(ns, [p for p in children if _live(p)])  # no surviving rank burns a GPU
    ttl = run.spec.policy.ttl_seconds_after_finished
    done = _ts(previous.get("completionTime"))
    if ttl is None or done is None:
        return Result()
    left = (done + timedelta(seconds=ttl) - now).total_seconds()
    if left > 0:
        return Result(requeue_after=left + 0.5)
    _delete_pods(ns, children)
    k8s.delete(k8s.SERVICES, ns, names.service(run.name))
    return Result()


def _gangs(all_pods: list[dict[str, Any]]) -> list[admission.Gang]:
    """The runs whose Pods all still carry the gang gate, from a cluster-wide Pod list."""
    by_run: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for p in all_pods:
        run = p["metadata"].get("labels", {}).get(names.LABEL_RUN)
        if run and admission.is_gated(p) and not p["metadata"].get("deletionTimestamp"):
            by_run[(p["metadata"]["namespace"], run)].append(p)
    gangs = []
    for key, members in by_run.items():
        first = min(members, key=lambda p: p["metadata"].get("creationTimestamp", ""))
        spec = first["spec"]
        gangs.append(
            admission.Gang(
                key=key,
                created=first["metadata"]
                .get("annotations", {})
                .get(pods.QUEUED_AT_ANNOTATION, first["metadata"].get("creationTimestamp", "")),
                size=len(members),
                request=admission.pod_requests(first),
                selector=spec.get("nodeSelector", {}),
                tolerations=spec.get("tolerations", []),
                pool=spec.get("nodeSelector", {}).get(pods.POOL_LABEL, ""),
            )
        )
    return gangs


def _cluster_pods() -> list[dict[str, Any]]:
    return k8s.list_(k8s.PODS, None, field_selector="status.phase!=Succeeded,status.phase!=Failed")


def _create_and_admit(
    run: api.TrainingRun, wanted: list[dict[str, Any]], current: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], admission.Decision | None, list[tuple[str, str, str]]]:
    """Create the missing node Pods and admit the gang when it fits, under one lock.

    A fresh gang that fits is created without gates (one write per Pod); one that does not
    is created gated and admitted later by lifting every gate together. Holding the lock
    while creating means the next decision sees these Pods' claim on the pool.
    """
    ns = run.namespace
    key = (ns, run.name)
    have = {p["metadata"]["name"] for p in current}
    missing = [p for p in wanted if p["metadata"]["name"] not in have]
    gated = [p for p in current if admission.is_gated(p)]
    queue = run.spec.scheduling.queue_name
    if not missing and not gated:
        return current, None, []  # created and admitted: nothing to decide
    if missing:
        k8s.apply(pods.service(run))
    if queue:  # Kueue admits plain Pod groups itself
        _parallel(k8s.apply, missing)
        telemetry.PODS_CREATED.inc(len(missing), namespace=ns)
        return current + missing, None, []
    if missing and current and len(gated) < len(current):
        # An admitted gang that lost some Pods before they were all created (operator
        # restart): finish it ungated.
        _parallel(k8s.apply, [pods.ungate(p) for p in missing])
        telemetry.PODS_CREATED.inc(len(missing), namespace=ns)
        return current + missing, None, []
    with _ADMISSION_LOCK:
        all_pods = _cluster_pods()
        gangs = [g for g in _gangs(all_pods) if g.key != key]
        gangs.append(_gang_of(run, wanted))
        decisions = admission.decide(gangs, k8s.list_(k8s.NODES), all_pods)
        decision = decisions[key]
        if decision.admit:
            by_name = {p["metadata"]["name"]: p for p in wanted}
            _parallel(
                k8s.apply,
                [pods.ungate(p) for p in missing]
                + [pods.ungate(by_name[p["metadata"]["name"]]) for p in gated],
            )
        else:
            _parallel(k8s.apply, missing)
    if missing:
        telemetry.PODS_CREATED.inc(len(missing), namespace=ns)
    others = [("TrainingRun", k[0], k[1]) for k, d in decisions.items() if d.admit and k != key]
    return current + missing, decision, others


def _gang_of(run: api.TrainingRun, wanted: list[dict[str, Any]]) -> admission.Gang:
    spec = wanted[0]["spec"]
    return admission.Gang(
        key=(run.namespace, run.name),
        created=str(run.metadata.get("creationTimestamp", "")),
        size=len(wanted),
        request=admission.pod_requests(wanted[0]),
        selector=spec.get("nodeSelector", {}),
        tolerations=spec.get("tolerations", []),
        pool=spec.get("nodeSelector", {}).get(pods.POOL_LABEL, ""),
    )


def _waiting_runs() -> list[tuple[str, str, str]]:
    """Runs waiting for admission: reconcile them when capacity frees up."""
    return [("TrainingRun", g.key[0], g.key[1]) for g in _gangs(_cluster_pods())]
