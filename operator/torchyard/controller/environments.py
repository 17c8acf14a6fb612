"""The Environment reconcile: a curated image resolved to its digest, or a built one.

:func:`reconcile` parses the Environment, observes its image (the registry's answer,
the build Job and, when the Job failed, its Pod's message), starts the one build Job
when the image is missing, writes the status once (``context.write``) and names the
TrainingRuns and OnlineEndpoints waiting on it when it became Ready or Failed; an ended
build's record goes to the registry (``recording``). Called by ``handlers``;
tested against a real control plane in tests/integration/test_environments.py.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from torchyard import api, envbuild, k8s, status
from torchyard.controller import context, recording, telemetry
from torchyard.controller.context import Context, Log, Outcome, Result
from torchyard.planning import environments as builds


def reconcile(body: Mapping[str, Any], logger: Log, ctx: Context) -> Result:
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
    changed = context.write(ctx, body, Outcome(new, now, context.phase_events(previous, new)))
    if new.get("phase") != previous.get("phase"):
        _count_build(new, build)
    result = Result()
    if changed and new.get("phase") in ("Ready", "Failed"):
        name = body["metadata"]["name"]
        for kind, res in (
            ("TrainingRun", k8s.TRAININGRUNS),
            ("OnlineEndpoint", k8s.ONLINEENDPOINTS),
        ):
            for obj in ctx.k8s.list_(res, ns):
                if obj.get("spec", {}).get("environment") == name:
                    result.also.append((kind, ns, obj["metadata"]["name"]))
    if new.get("phase") == "Building":
        result.requeue_after = 30.0  # Job events wake us sooner
    elif new.get("phase") in ("Ready", "Failed") and not _recorded(ctx, body, new, build):
        result.requeue_after = recording.RETRY_SECONDS
    return result


def _recorded(
    ctx: Context,
    body: Mapping[str, Any],
    new: dict[str, Any],
    build: status.BuildObserved | None,
) -> bool:
    """The ended build's record (``recording``), with the tail of its Pod's log; False
    while the registry cannot be reached."""
    if not recording.environment_wanted(ctx, body):
        return True
    ns = body["metadata"]["namespace"]
    pods = []
    if build is not None and build.job:
        pods = ctx.k8s.list_(k8s.PODS, ns, label_selector=f"job-name={build.job}")
    return recording.built_environment(ctx, {**body, "status": new}, pods)


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


def _registry_auth(env: api.Environment, ns: str, ctx: Context) -> dict[str, Any]:
    secret_name = env.spec.registry.push_secret if env.spec.registry else None
    if not secret_name:
        return {}
    secret = ctx.k8s.get_or_none(k8s.SECRETS, ns, secret_name) or {}
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
    hash_ = builds.content_hash(env)
    target = builds.target(env, hash_)
    host, repo, tag = envbuild.parse_reference(target)
    registry_error = ""
    image = None
    try:
        client = envbuild.Registry(
            host,
            _registry_auth(env, ns, ctx),
            insecure=env.spec.registry.insecure or None,
            timeout=10,
        )
        digest = client.manifest_digest(repo, tag)
        if digest:
            image = f"{env.spec.registry.repository.rstrip('/')}@{digest}"
    except envbuild.BuildError as err:
        registry_error = str(err)
    name = builds.job_name(env, hash_)
    job = ctx.k8s.get_or_none(k8s.JOBS, ns, name)
    if image is not None:
        state = job_state(job) if job else ""
        return status.BuildObserved(
            hash_,
            image=image,
            job=name if job else None,
            job_state=state,
            job_seconds=_job_seconds(job),
        )
    if job is None:
        recipe = builds.recipe_configmap(env, hash_)
        if recipe is not None:
            ctx.k8s.apply(recipe)
        job = ctx.k8s.apply(builds.build_job(env, hash_, ctx.settings))
        logger.info(
            "Environment %s/%s: building %s in Job %s", ns, env.metadata.get("name"), target, name
        )
    state = job_state(job)
    message = _explain(_job_failure(ns, name, ctx), env.spec.python) if state == "Failed" else ""
    return status.BuildObserved(
        hash_,
        job=name,
        job_state=state,
        job_message=message,
        registry_error=registry_error,
        job_seconds=_job_seconds(job),
    )


def job_state(job: Mapping[str, Any] | None) -> str:
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
    start, stop = context.parse_time(st.get("startTime")), context.parse_time(end)
    if start is None or stop is None:
        return None
    return max(0.0, (stop - start).total_seconds())


def _job_failure(ns: str, job: str, ctx: Context) -> str:
    """The builder's error (its JSON termination message) or the tail of its log."""
    for pod in ctx.k8s.list_(k8s.PODS, ns, label_selector=f"job-name={job}"):
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
