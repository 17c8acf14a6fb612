"""MLflow tracking, as pure builders: the experiment a TrainingRun goes into, the bodies of
the MLflow REST calls that mirror it (``/api/2.0/mlflow/...``), and the environment its
processes get (``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_ID``, ``MLFLOW_RUN_ID``, and
the credentials as references to a Secret, never their values).

No I/O, no clock: ``controller.tracking`` feeds them the times and sends what they build
(through ``controller.mlflow_rest``); ``planning.pods`` adds :func:`env` to every node Pod.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torchyard.api import TrainingRun, wire

# MLflow's limits on one runs/log-batch call (its REST API refuses more).
MAX_PARAMS = 100
MAX_TAGS = 100
MAX_METRICS = 1000
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
# The keys of the credentials Secret a node Pod takes as MLflow's own variables.
SECRET_KEYS = ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
# The tag MLflow shows a run's children under.
PARENT_TAG = "mlflow.parentRunId"
# MLflow run statuses by terminal phase.
FINAL_STATUS = {"Succeeded": "FINISHED", "Failed": "FAILED", "Cancelled": "KILLED"}


@dataclass(frozen=True)
class Settings:
    """The operator's tracking server (the chart's ``tracking.mlflow``): its URI ("" =
    none, and nothing changes) and the name of the Secret of its credentials ("" = none)."""

    uri: str = ""
    secret: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.uri)


# A namespace's own tracking server, over the chart's: this ConfigMap in the run's namespace,
# with the keys of OVERRIDE_KEYS (``mlflowUri`` "": no tracking in that namespace).
OVERRIDE_CONFIGMAP = "torchyard-tracking"
OVERRIDE_KEYS = ("mlflowUri", "credentialsSecret")


def override(chart: Settings, data: Mapping[str, Any] | None) -> tuple[Settings, list[str]]:
    """The tracking settings of a namespace: the chart's, with what the namespace's
    :data:`OVERRIDE_CONFIGMAP` (its ``data``, None when there is none) sets instead; and
    the keys it has that mean nothing here (said, not applied). A URI that is no server's
    is kept as it is: calling it fails, and the run says so (``TrackingReady=False``)."""
    if data is None:
        return chart, []
    unknown = sorted(str(k) for k in data if k not in OVERRIDE_KEYS)
    uri = str(data.get("mlflowUri", chart.uri)).strip()
    secret = str(data.get("credentialsSecret", chart.secret if uri == chart.uri else "")).strip()
    return Settings(uri=uri, secret=secret), unknown


def experiment_name(run: TrainingRun) -> str:
    """The run's experiment label, else its namespace."""
    labels = run.metadata.get("labels") or {}
    annotations = run.metadata.get("annotations") or {}
    name = annotations.get(wire.ANNOTATION_EXPERIMENT_NAME) or labels.get(wire.LABEL_EXPERIMENT)
    return str(name or run.namespace)


def sweep_of(run: TrainingRun) -> tuple[str, str] | None:
    """(name, uid) of the Sweep that owns this trial, None for a run of its own."""
    for ref in run.metadata.get("ownerReferences") or []:
        if ref.get("kind") == "Sweep" and ref.get("uid"):
            return str(ref.get("name", "")), str(ref["uid"])
    return None


def _clip(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text[:limit]


def params(run: TrainingRun, image: str) -> list[dict[str, str]]:
    """What torchyard knows of the run's inputs: its command, its sweep parameters, its
    world size and its image (a digest when the Environment resolved one)."""
    out = {
        "torchyard.command": _clip(list(run.spec.command), MAX_PARAM_VALUE),
        "torchyard.world_size": str(run.spec.distribution.world_size),
        "torchyard.nodes": str(run.spec.distribution.node_count),
        "torchyard.image": _clip(image, MAX_PARAM_VALUE),
    }
    raw = (run.metadata.get("annotations") or {}).get(wire.ANNOTATION_PARAMETERS)
    try:
        sweep_params = json.loads(raw) if raw else {}
    except ValueError:
        sweep_params = {}
    if isinstance(sweep_params, dict):
        for key, value in sorted(sweep_params.items()):
            out[str(key)[:250]] = _clip(value, MAX_PARAM_VALUE)
    return [{"key": k, "value": v} for k, v in list(out.items())[:MAX_PARAMS]]


def tags(run: TrainingRun, parent_run_id: str | None = None) -> list[dict[str, str]]:
    """The tags an MLflow run starts with: where it came from in Kubernetes (and its parent)."""
    out = {
        "torchyard.namespace": run.namespace,
        "torchyard.run": run.name,
        "torchyard.uid": str(run.metadata.get("uid") or ""),
        "mlflow.runName": run.name,
        "mlflow.source.type": "JOB",
        "mlflow.source.name": f"torchyard:{run.namespace}/{run.name}",
    }
    sweep = sweep_of(run)
    if sweep is not None:
        out["torchyard.sweep"] = sweep[0]
    if parent_run_id:
        out[PARENT_TAG] = parent_run_id
    return [{"key": k, "value": v} for k, v in out.items()]


def create_run(
    experiment_id: str, run: TrainingRun, start_ms: int, parent: str | None
) -> dict[str, Any]:
    """The body of ``runs/create`` for one TrainingRun."""
    return {
        "experiment_id": experiment_id,
        "run_name": run.name,
        "start_time": start_ms,
        "tags": tags(run, parent),
    }


def create_parent(
    experiment_id: str, sweep: tuple[str, str], namespace: str, start_ms: int
) -> dict[str, Any]:
    """The body of ``runs/create`` for a Sweep's parent run (its trials' runs are children)."""
    name, uid = sweep
    return {
        "experiment_id": experiment_id,
        "run_name": name,
        "start_time": start_ms,
        "tags": [
            {"key": "torchyard.namespace", "value": namespace},
            {"key": "torchyard.sweep", "value": name},
            {"key": "torchyard.sweep_uid", "value": uid},
            {"key": "mlflow.runName", "value": name},
        ],
    }


def parent_filter(sweep_uid: str) -> str:
    """The ``runs/search`` filter that finds a Sweep's parent run."""
    return f"tags.`torchyard.sweep_uid` = '{sweep_uid}'"


def progress_metrics(progress: Mapping[str, Any] | None, timestamp_ms: int) -> list[dict[str, Any]]:
    """``status.progress`` as MLflow metrics at its step: the step rate, percent, and the
    ranks' own reported metrics (bounded: at most :data:`MAX_METRICS`)."""
    if not progress or progress.get("step") is None:
        return []
    step = int(progress["step"])
    values: dict[str, Any] = {
        "torchyard.steps_per_second": progress.get("stepsPerSecond"),
        "torchyard.percent": progress.get("percent"),
    }
    for key, value in sorted((progress.get("metrics") or {}).items()):
        values[str(key)[:250]] = value
    return [
        {"key": k, "value": float(v), "timestamp": timestamp_ms, "step": step}
        for k, v in values.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    ][:MAX_METRICS]


def log_batch(
    run_id: str,
    *,
    params_: Sequence[Mapping[str, str]] = (),
    tags_: Sequence[Mapping[str, str]] = (),
    metrics: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The body of ``runs/log-batch``."""
    return {
        "run_id": run_id,
        "params": [dict(p) for p in params_][:MAX_PARAMS],
        "tags": [{"key": t["key"], "value": t["value"][:MAX_TAG_VALUE]} for t in tags_][:MAX_TAGS],
        "metrics": [dict(m) for m in metrics][:MAX_METRICS],
    }


def final_tags(status: Mapping[str, Any]) -> list[dict[str, str]]:
    """The tags a finished run gets: its attempt, failure class and ModelVersion."""
    out = {
        "torchyard.phase": str(status.get("phase") or ""),
        "torchyard.attempt": str(status.get("restarts") or 0),
    }
    failure = status.get("failure") or {}
    if failure.get("failureClass") or failure.get("reason"):
        out["torchyard.failure_class"] = str(failure.get("failureClass") or failure.get("reason"))
    model = status.get("model") or {}
    if model.get("name"):
        out["torchyard.model_version"] = f"{model['name']}/{model.get('version', '')}"
    return [{"key": k, "value": v} for k, v in out.items()]


def registered_model(name: str, namespace: str) -> dict[str, Any]:
    """The body of ``registered-models/create`` for a torchyard model."""
    return {"name": name, "tags": [{"key": "torchyard.namespace", "value": namespace}]}


def model_version(name: str, version: int | str, run_id: str, namespace: str) -> dict[str, Any]:
    """The body of ``model-versions/create``: the ModelVersion ``name``/``version`` made
    by the MLflow run ``run_id``; its source is the torchyard URI of its files (the URI a
    run's ``spec.inputs`` takes)."""
    return {
        "name": name,
        "source": f"model://{name}/{version}",
        "run_id": run_id,
        "tags": [
            {"key": "torchyard.namespace", "value": namespace},
            {"key": "torchyard.model_version", "value": f"{name}/{version}"},
        ],
        "description": f"torchyard ModelVersion {namespace}/{name}-v{version}",
    }


def update_run(run_id: str, phase: str, end_ms: int) -> dict[str, Any]:
    """The body of ``runs/update`` that ends the MLflow run as the TrainingRun ended."""
    return {"run_id": run_id, "status": FINAL_STATUS.get(phase, "FINISHED"), "end_time": end_ms}


def env(settings: Settings, tracking: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The variables every process of a node Pod gets: the server, the experiment and the
    run, and the credentials as ``secretKeyRef`` to the Secret of the chart's name in the
    run's namespace (optional: a namespace without one logs anonymously). None until the
    operator created the run: ranks started while the server could not be reached get
    nothing, so that a script's ``mlflow`` calls open no stray run of their own."""
    if not settings.enabled or not tracking or not tracking.get("runId"):
        return []
    out: list[dict[str, Any]] = [
        {"name": "MLFLOW_TRACKING_URI", "value": settings.uri},
        {"name": "MLFLOW_EXPERIMENT_ID", "value": str(tracking.get("experimentId", ""))},
        {"name": "MLFLOW_RUN_ID", "value": str(tracking["runId"])},
    ]
    if settings.secret:
        out.extend(
            {
                "name": key,
                "valueFrom": {
                    "secretKeyRef": {"name": settings.secret, "key": key, "optional": True}
                },
            }
            for key in SECRET_KEYS
        )
    return out
