"""OnlineEndpoint status as a pure function of what the controller observed: its
Environment, model and inputs cache entries, its Deployments (or InferenceService) and
their serving Pods.

The phase: ``Pending`` while the endpoint waits for something outside it (an Environment
being built, a Sweep that has registered no model yet), ``Preparing`` while the model is
fetched into the inputs cache, ``Deploying`` until a Pod serves, ``Updating`` while a
rollout replaces Pods (the old ones serve until the new ones are ready), ``Ready``, and,
when a serving Pod fails, ``Degraded`` (others still serve) or ``Failed``. A serving Pod
fails the way a node Pod does, read the same way: its termination message (the serving
runtime writes the runs' shape when ``init()`` raises: ``InitFailed``, the exception's
class, the script's traceback), a reason of the kubelet (``OOMKilled``, an image that
cannot be pulled), classified by ``classes`` with advice; so the endpoint says why instead
of a bare CrashLoopBackOff. Conditions: Accepted, ModelReady, Available, Ready and
kstatus' Reconciling and Stalled. Called by ``controller.endpoints``; tested as tables in
tests/unit/status/test_endpoints.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from torchyard.api import OnlineEndpoint, wire
from torchyard.launch import classes
from torchyard.serving import contract
from torchyard.status import inputs as input_status
from torchyard.status.conditions import condition, invalid_spec_status, merge, progress
from torchyard.status.failures import STUCK_REASONS

SERVING_CONTAINERS = ("scorer", "kserve-container")
WAITING = ("CrashLoopBackOff", *sorted(STUCK_REASONS))
_PULL = (
    "the Environment's image cannot be pulled on the node: check status.image of the "
    "Environment, that the image exists, and the node's access to its registry"
)
ADVICE = {
    "ErrImagePull": _PULL,
    "ImagePullBackOff": _PULL,
    "InvalidImageName": _PULL,
    "CreateContainerConfigError": "the kubelet cannot set up the serving container (a "
    "ConfigMap or Secret it needs is missing): see the message",
    "CreateContainerError": "the container runtime cannot create the serving container: "
    "see the message",
    contract.INIT_FAILED: "the scoring script's init() raised (its traceback is the message): "
    "fix the script or the model it loads; the kubelet restarts the Pod with a back-off, "
    "and during a rollout the Pods of the version before keep serving",
    contract.RUNTIME_FAILED: "the serving runtime could not start in the Environment's image: "
    "its Python must be 3.11 or newer (the runtime's Starlette needs it)",
}
# A failure of the init container: before any scoring code ran, so not the script's.
PREPARE_ADVICE = (
    f"the serving Pod's {contract.PREPARE_CONTAINER!r} init container failed before the "
    "scoring script ran: it fetches the model's files (checked against the model's "
    "manifest) and the scoring source; see the message: a model version or source it "
    "cannot read, a file that does not match the manifest, the registry unreachable, or "
    "(OOMKilled) more memory than its limit"
)


@dataclass(frozen=True)
class Workload:
    """One Deployment of the endpoint (or its InferenceService), as observed."""

    track: str
    version: int
    percent: int
    name: str
    desired: int  # Pods it asks for
    ready: int = 0
    updated: int = 0
    rolled: bool = False  # every Pod is of the current template, none of an older one
    key: str = ""
    # the Deployment's progress deadline passed without its Pods getting ready (its
    # Progressing condition's message), e.g. an init() that never returns
    stuck: str = ""


@dataclass(frozen=True)
class EndpointObserved:
    """What the controller saw this time (see the module docstring)."""

    waiting: tuple[str, str] | None = None  # (reason, message): something outside it
    failed: tuple[str, str] | None = None  # (reason, message): only an edit can help
    model: tuple[str, int] | None = None
    inputs: input_status.InputsObserved | None = None
    workloads: Sequence[Workload] = ()
    pods: Sequence[Mapping[str, Any]] = field(default_factory=list)
    scoring_uri: str = ""


def _serving(pod: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
    statuses = pod.get("status", {})
    init = [cs for cs in statuses.get("initContainerStatuses") or [] if not cs.get("ready")]
    main = [
        cs for cs in statuses.get("containerStatuses") or [] if cs.get("name") in SERVING_CONTAINERS
    ]
    return (*init, *main)


def _termination_info(terminated: Mapping[str, Any]) -> dict[str, Any]:
    """A terminated container's termination message: its JSON object, or its text."""
    try:
        info = json.loads(terminated.get("message") or "")
    except ValueError:
        text = str(terminated.get("message") or "").strip()
        return {"message": text} if text else {}
    return info if isinstance(info, dict) else {}


def pod_failure(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """Why a serving Pod does not serve, when it fails (None while it starts or serves)."""
    for cs in _serving(pod):
        if cs.get("ready"):
            continue
        state = cs.get("state") or {}
        waiting = state.get("waiting") or {}
        ended = state.get("terminated") or (cs.get("lastState") or {}).get("terminated")
        if waiting.get("reason") in STUCK_REASONS:
            return _failure(
                pod, cs, {"reason": waiting["reason"], "message": waiting.get("message", "")}
            )
        if ended and ended.get("exitCode") not in (None, 0):
            info = _termination_info(ended)
            reason = ended.get("reason") if ended.get("reason") not in (None, "Error") else None
            info["reason"] = reason or info.get("reason") or "Error"
            info.setdefault("exitCode", ended.get("exitCode"))
            return _failure(pod, cs, info)
    return None


def _failure(
    pod: Mapping[str, Any], cs: Mapping[str, Any], info: Mapping[str, Any]
) -> dict[str, Any]:
    reason = str(info.get("reason") or "Error")
    message = str(info.get("message") or "")
    evidence: classes.Evidence = {
        "exitCode": info.get("exitCode"),
        "reason": reason,
        "message": message,
    }
    found = classes.classify(evidence)
    meta = pod.get("metadata", {})
    version = (meta.get("labels") or {}).get(wire.LABEL_MODEL_VERSION)
    out: dict[str, Any] = {
        "class": found[0].name if found else reason,
        "reason": reason,
        "message": message[-3000:],
        "advice": ADVICE.get(reason) or _class_advice(cs, found),
        "pod": meta.get("name"),
        "restarts": int(cs.get("restartCount") or 0),
    }
    if info.get("exception"):
        out["exception"] = str(info["exception"])
    if isinstance(info.get("exitCode"), int):
        out["exitCode"] = info["exitCode"]
    if version and version.isdigit():
        out["version"] = int(version)
    return {k: v for k, v in out.items() if v not in ("", None)}


def _class_advice(cs: Mapping[str, Any], found: tuple[classes.Rule, str] | None) -> str:
    """The advice of a failure that no reason of its own explains: the init container's
    (no scoring code ran yet), else its class's."""
    if cs.get("name") == contract.PREPARE_CONTAINER:
        return PREPARE_ADVICE
    return found[0].advice if found else ""


def first_failure(pods: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The failure of the first failing Pod by name (stable from one reconcile to the next)."""
    for pod in sorted(pods, key=lambda p: str(p.get("metadata", {}).get("name"))):
        found = pod_failure(pod)
        if found is not None:
            return found
    return None


def stuck_failure(loads: Sequence[Workload]) -> dict[str, Any] | None:
    """A rollout whose Pods never got ready within its progress deadline (no Pod said
    why: it runs, but init() has not returned)."""
    for load in loads:
        if load.stuck:
            return {
                "class": "InitTimeout",
                "reason": "ProgressDeadlineExceeded",
                "message": f"Deployment {load.name}: {load.stuck}",
                "advice": "the serving Pods run but never got ready: init() has not returned "
                "(it may hang, or load more than the Pod's memory lets it); see "
                "torchyard endpoints logs",
                "version": load.version,
            }
    return None


def _phase(observed: EndpointObserved, failure: Mapping[str, Any] | None) -> tuple[str, str, str]:
    """(phase, reason, message) of the serving part."""
    loads = observed.workloads
    desired = sum(w.desired for w in loads)
    ready = sum(w.ready for w in loads)
    if failure is not None:
        said = f"Pod {failure.get('pod')} fails ({failure.get('class')}): {failure.get('advice')}"
        if ready:
            return "Degraded", str(failure.get("reason")), f"{ready}/{desired} Pods serve; {said}"
        return "Failed", str(failure.get("reason")), said
    if ready and all(w.rolled and w.ready >= w.desired for w in loads):
        return "Ready", "Serving", f"{ready}/{desired} Pods serve"
    if ready:
        return "Updating", "RollingOut", f"{ready}/{desired} Pods serve; rolling out"
    return "Deploying", "Deploying", f"0/{desired} Pods ready: the model loads (init())"


def endpoint_status(
    ep: OnlineEndpoint, observed: EndpointObserved, previous: Mapping[str, Any], now: datetime
) -> dict[str, Any]:
    gen = ep.generation
    desired: list[dict[str, Any]] = [
        condition("Accepted", True, "Valid", "the spec is valid", observed_generation=gen)
    ]
    status: dict[str, Any] = {"observedGeneration": gen}
    if observed.model is not None:
        status["model"] = {"name": observed.model[0], "version": observed.model[1]}
    model_ready = condition(
        "ModelReady",
        False,
        "Waiting",
        "the model version is not known yet",
        observed_generation=gen,
    )
    failure = None
    if observed.failed is not None:
        phase, reason, message = "Failed", *observed.failed
    elif observed.waiting is not None:
        phase, reason, message = "Pending", *observed.waiting
    else:
        decision = input_status.decide(observed.inputs or input_status.InputsObserved(), gen)
        model_ready = {**decision.condition, "type": "ModelReady"}
        if observed.inputs is not None and observed.inputs.entries:
            status["inputs"] = [dict(e) for e in observed.inputs.entries]
        if decision.failure is not None:
            phase, reason, message = (
                "Failed",
                input_status.INPUT_FETCH_FAILED,
                model_ready["message"],
            )
        elif decision.waiting:
            phase, reason, message = "Preparing", str(model_ready["reason"]), model_ready["message"]
        else:
            failure = first_failure(observed.pods) or stuck_failure(observed.workloads)
            phase, reason, message = _phase(observed, failure)
            _serving_fields(status, observed, failure)
    ready = sum(w.ready for w in observed.workloads)
    desired += [
        model_ready,
        condition(
            "Available",
            ready > 0,
            reason if not ready else "Serving",
            message if not ready else f"{ready} Pod(s) serve",
            observed_generation=gen,
        ),
        condition("Ready", phase == "Ready", reason, message, observed_generation=gen),
        *progress(
            phase in ("Pending", "Preparing", "Deploying", "Updating"),
            phase in ("Failed", "Degraded"),
            reason,
            message,
            observed_generation=gen,
        ),
    ]
    status.update(phase=phase, message=message)
    status["conditions"] = merge(previous.get("conditions"), desired, now)
    return status


def _serving_fields(
    status: dict[str, Any], observed: EndpointObserved, failure: Mapping[str, Any] | None
) -> None:
    status["versions"] = [
        {
            "version": w.version,
            "percent": w.percent,
            "deployment": w.name,
            "replicas": w.desired,
            "readyReplicas": w.ready,
            "updatedReplicas": w.updated,
            **({"key": w.key} if w.key else {}),
        }
        for w in observed.workloads
    ]
    status["replicas"] = sum(w.desired for w in observed.workloads)
    status["readyReplicas"] = sum(w.ready for w in observed.workloads)
    if observed.scoring_uri:
        status["scoringUri"] = observed.scoring_uri
    if failure is not None:
        status["failure"] = dict(failure)


def invalid_endpoint_status(
    generation: int | None, message: str, previous: Mapping[str, Any] | None, now: datetime
) -> dict[str, Any]:
    """An OnlineEndpoint the controller cannot serve: the one InvalidSpec status, with its
    ``message``."""
    return invalid_spec_status(
        generation, message, previous, now, failed_condition=False, fields={"message": message}
    )


def deployment_workload(
    track: str,
    version: int,
    percent: int,
    name: str,
    desired: int | None,
    deployment: Mapping[str, Any] | None,
    key: str = "",
) -> Workload:
    """A Deployment's rollout as a :class:`Workload` (``desired`` None: its own count, the
    autoscaler's)."""
    if deployment is None:
        return Workload(track, version, percent, name, desired or 0, key=key)
    meta, spec, st = (
        deployment.get("metadata", {}),
        deployment.get("spec", {}),
        deployment.get("status", {}),
    )
    want = desired if desired is not None else int(spec.get("replicas") or 0)
    updated = int(st.get("updatedReplicas") or 0)
    rolled = (
        int(st.get("observedGeneration") or 0) >= int(meta.get("generation") or 0)
        and updated >= want
        and int(st.get("replicas") or 0) <= updated
    )
    stuck = next(
        (
            str(c.get("message") or "")
            for c in st.get("conditions") or []
            if c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded"
        ),
        "",
    )
    ready = int(st.get("readyReplicas") or 0)
    return Workload(track, version, percent, name, want, ready, updated, rolled, key, stuck)
