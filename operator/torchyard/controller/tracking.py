"""One MLflow run per TrainingRun, kept by the operator (with a tracking server set: the
chart's ``tracking.mlflow.uri``; without one nothing here runs).

- :func:`start`, before a gang's first Pods: the MLflow run is found (tagged with the
  TrainingRun's uid: a restart of the operator between creating it and writing the status
  finds it again) or created, in the run's experiment (``planning.tracking``), as a child
  of its Sweep's parent run for a trial, with torchyard's parameters; its ids go into
  ``status.tracking`` and, through ``planning.pods``, into every process's environment.
- :func:`mirror`, after the status was computed: progress metrics as they advance, and
  when the run ended its final tags and status (``runs/update``), once.

A server that cannot be reached or refuses is ``TrackingReady=False`` with the error and a
Warning Event, never a failed run; tries are spaced out (:data:`BACKOFF_SECONDS` doubling
up to :data:`BACKOFF_MAX_SECONDS`), and the ranks of a gang started meanwhile get no MLflow
variables. Called by ``trainingruns``; the REST calls are ``mlflow_rest``'s.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from torchyard import api, k8s
from torchyard.controller import mlflow_rest
from torchyard.controller.context import Context, Event, Log
from torchyard.controller.mlflow_rest import Client, TrackingError
from torchyard.planning import tracking as plan
from torchyard.status import trainingruns as run_status

BACKOFF_SECONDS = 5.0
BACKOFF_MAX_SECONDS = 300.0
OVERRIDE_SECONDS = 10.0  # a namespace's torchyard-tracking ConfigMap is read this often
_PARENT_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_LOCK = threading.Lock()


@dataclass
class Mirrored:
    """What :func:`mirror` did: the new ``status.tracking``, its Events, and when to try
    again (None: nothing to retry)."""

    state: dict[str, Any] | None
    events: list[Event] = field(default_factory=list)
    retry: float | None = None


def scoped(ctx: Context, namespace: str, logger: Log) -> Context:
    """``ctx`` with the tracking settings of ``namespace``: the chart's, or what the
    namespace's ``torchyard-tracking`` ConfigMap sets instead (``planning.tracking
    .override``), read at most every :data:`OVERRIDE_SECONDS` per namespace. The
    operator's own calls carry its own credentials (it never reads a namespace's
    Secrets); the ranks take the namespace's ``credentialsSecret`` by reference."""
    now = ctx.clock()
    held = ctx.tracking_overrides.get(namespace)
    if held is None or (now - held[0]).total_seconds() >= OVERRIDE_SECONDS:
        found = ctx.k8s.get_or_none(k8s.CONFIGMAPS, namespace, plan.OVERRIDE_CONFIGMAP)
        data = None if found is None else dict(found.get("data") or {})
        held = ctx.tracking_overrides[namespace] = (now, data)
    chart = ctx.chart_tracking or ctx.settings.tracking
    settings, unknown = plan.override(chart, held[1])
    if unknown and held[0] == now:
        logger.warning(
            "ConfigMap %s/%s: keys %s mean nothing (the keys: %s)",
            namespace,
            plan.OVERRIDE_CONFIGMAP,
            ", ".join(unknown),
            ", ".join(plan.OVERRIDE_KEYS),
        )
    if settings == ctx.settings.tracking:
        return ctx
    return replace(
        ctx,
        settings=replace(ctx.settings, tracking=settings),
        chart_tracking=chart,
    )


def client(ctx: Context) -> Client:
    return Client(ctx.settings.tracking.uri)


def _ms(now: datetime) -> int:
    return int(now.timestamp() * 1000)


def _key(run: api.TrainingRun) -> str:
    return str(run.metadata.get("uid") or f"{run.namespace}/{run.name}")


def _due(ctx: Context, run: api.TrainingRun, now: datetime) -> bool:
    tried = ctx.tracking_tries.get(_key(run))
    return tried is None or now >= tried[1]


def _backoff(ctx: Context, run: api.TrainingRun, now: datetime) -> float:
    """Count a failed try; the seconds until the next."""
    failures = ctx.tracking_tries.get(_key(run), (0, now))[0] + 1
    wait = float(min(BACKOFF_MAX_SECONDS, BACKOFF_SECONDS * 2.0 ** (failures - 1)))
    ctx.tracking_tries[_key(run)] = (failures, now + timedelta(seconds=wait))
    return wait


def start(
    ctx: Context,
    run: api.TrainingRun,
    previous: Mapping[str, Any],
    image: str,
    now: datetime,
    logger: Log,
) -> dict[str, Any] | None:
    """``status.tracking`` with the run's MLflow run, found or created (see the module
    docstring); with ``error`` when the server failed; None without a tracking server."""
    if not ctx.settings.tracking.enabled:
        return None
    state = dict(previous.get("tracking") or {})
    if state.get("runId") or not _due(ctx, run, now):
        return state
    try:
        found = _find_or_create(client(ctx), run, image, now)
    except TrackingError as err:
        wait = _backoff(ctx, run, now)
        logger.warning(
            "TrainingRun %s/%s: MLflow: %s (next try in %.0fs)", run.namespace, run.name, err, wait
        )
        state["error"] = str(err)
        return state
    ctx.tracking_tries.pop(_key(run), None)
    return found


def _find_or_create(c: Client, run: api.TrainingRun, image: str, now: datetime) -> dict[str, Any]:
    name = plan.experiment_name(run)
    experiment = c.experiment_id(name)
    mine = c.search_runs(experiment, f"tags.`torchyard.uid` = '{_key(run)}'")
    if mine:
        run_id = mlflow_rest.field(mine[0], "info", "run_id")
    else:
        sweep = plan.sweep_of(run)
        parent = _parent(c, experiment, sweep, run.namespace, now) if sweep else None
        run_id = c.create_run(plan.create_run(experiment, run, _ms(now), parent))
        c.log_batch(plan.log_batch(run_id, params_=plan.params(run, image)))
    return {"runId": run_id, "experimentId": experiment, "experiment": name}


def _parent(
    c: Client, experiment: str, sweep: tuple[str, str], namespace: str, now: datetime
) -> str:
    """The Sweep's parent run, found by its uid's tag or created (once per operator: the
    trials of one Sweep are started by several workers at once)."""
    with _LOCKS_LOCK:
        lock = _PARENT_LOCKS.setdefault(sweep[1], threading.Lock())
    with lock:
        found = c.search_runs(experiment, plan.parent_filter(sweep[1]))
        if found:
            return mlflow_rest.field(found[0], "info", "run_id")
        return c.create_run(plan.create_parent(experiment, sweep, namespace, _ms(now)))


def mirror(
    ctx: Context,
    run: api.TrainingRun,
    previous: Mapping[str, Any],
    new: Mapping[str, Any],
    state: Mapping[str, Any] | None,
    now: datetime,
    logger: Log,
) -> Mirrored:
    """After the status was computed: a run not tracked yet is tried again (when due), its
    progress mirrored when it advanced, its end once (see the module docstring)."""
    if not ctx.settings.tracking.enabled:
        return Mirrored(None)
    current = dict(state if state is not None else previous.get("tracking") or {})
    if not current.get("runId") and current.get("error"):  # its start failed: again
        current = start(ctx, run, {"tracking": current}, "", now, logger) or current
    if current.get("runId") and not current.get("ended") and _due(ctx, run, now):
        current = _send(ctx, run, new, current, now, logger)
    return Mirrored(current, _events(previous, current), _retry(ctx, run, current, now))


def _send(
    ctx: Context,
    run: api.TrainingRun,
    new: Mapping[str, Any],
    state: dict[str, Any],
    now: datetime,
    logger: Log,
) -> dict[str, Any]:
    c, run_id = client(ctx), str(state["runId"])
    progress = new.get("progress") or {}
    step = progress.get("step")
    ended = new.get("phase") in run_status.TERMINAL
    registered = ""
    try:
        if step is not None and step != state.get("step"):
            c.log_batch(plan.log_batch(run_id, metrics=plan.progress_metrics(progress, _ms(now))))
        if ended:
            c.log_batch(plan.log_batch(run_id, tags_=plan.final_tags(new)))
            c.update_run(plan.update_run(run_id, str(new["phase"]), _ms(now)))
            registered = _register(c, run, new, run_id)
    except TrackingError as err:
        wait = _backoff(ctx, run, now)
        logger.warning(
            "TrainingRun %s/%s: MLflow: %s (next try in %.0fs)", run.namespace, run.name, err, wait
        )
        return {**state, "error": str(err)}
    ctx.tracking_tries.pop(_key(run), None)
    out = {k: v for k, v in state.items() if k != "error"}
    if step is not None:
        out["step"] = step
    if ended:
        out["ended"] = True
        if registered:
            out["modelVersion"] = registered
    return out


def _register(c: Client, run: api.TrainingRun, new: Mapping[str, Any], run_id: str) -> str:
    """The run's new model version in MLflow's model registry, when its
    ``outputs.register.mlflowRegistry`` asks and it registered one; "" otherwise."""
    asked = run.spec.outputs.register_
    model = new.get("model") or {}
    if asked is None or not asked.mlflow_registry or not model.get("name"):
        return ""
    name, version = str(model["name"]), model.get("version", "")
    return c.register_version(
        plan.registered_model(name, run.namespace),
        plan.model_version(name, version, run_id, run.namespace),
    )


def unfinished(ctx: Context, previous: Mapping[str, Any]) -> bool:
    """Whether a finished TrainingRun's MLflow run still has to be ended."""
    state = previous.get("tracking") or {}
    return ctx.settings.tracking.enabled and bool(state.get("runId")) and not state.get("ended")


def _events(previous: Mapping[str, Any], state: Mapping[str, Any]) -> list[Event]:
    """A Warning when the server starts failing (not again while it keeps failing)."""
    before = previous.get("tracking") or {}
    if state.get("error") and not before.get("error"):
        return [Event("Warning", "TrackingFailed", str(state["error"]))]
    if state.get("runId") and not before.get("runId"):
        return [Event("Normal", "Tracked", f"MLflow run {state['runId']}")]
    return []


def _retry(
    ctx: Context, run: api.TrainingRun, state: Mapping[str, Any], now: datetime
) -> float | None:
    """When to look again: at the next try after an error."""
    tried = ctx.tracking_tries.get(_key(run))
    if not state.get("error") or tried is None:
        return None
    return max(0.0, (tried[1] - now).total_seconds())
