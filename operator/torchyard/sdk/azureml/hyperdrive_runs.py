"""``HyperDriveRun``: a Sweep as Azure ML's run of a HyperDriveConfig. :func:`submit`
(``Experiment.submit(hyperdrive_config)``) stores the source snapshot, registers the
environment and creates the Sweep (``hyperdrive.sweep_manifest``); the run reads the
Sweep's status and its ledger, the ConfigMap ``<sweep>-trials`` that holds every trial
(parameters, state, the metric at each interval), for ``get_status``,
``wait_for_completion``, ``get_children_sorted_by_primary_metric``, ``get_metrics`` and
``get_best_run_by_primary_metric`` (the best trial as the :class:`Run` of its TrainingRun,
so ``register_model`` works on it), and cancels it (``spec.cancel``). Tested in
tests/unit/sdk/test_hyperdrive.py against an in-memory fake of ``torchyard.k8s``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torchyard import api, k8s
from torchyard.api import sweeps as sweep_api
from torchyard.planning import names
from torchyard.sdk.azureml.common import ActivityFailedException, TorchyardSdkError
from torchyard.sdk.azureml.experiments import Run
from torchyard.sdk.azureml.hyperdrive import HyperDriveConfig, sweep_manifest
from torchyard.sweeps.space import format_value

if TYPE_CHECKING:
    from torchyard.sdk.azureml.experiments import Experiment

# Azure run states by Sweep phase, and a child run's by trial state (Azure ML shows a
# trial its policy ended as Canceled).
STATUS = {"Pending": "Queued", "Running": "Running", "Succeeded": "Completed", "Failed": "Failed"}
CHILD_STATUS = {
    "Pending": "Queued",
    "Running": "Running",
    "Completed": "Completed",
    "Stopped": "Canceled",
    "Canceled": "Canceled",
    "Failed": "Failed",
}
TERMINAL = ("Succeeded", "Failed")
FIELD_MANAGER = "torchyard-sweep-cancel"


class SweepNotFound(TorchyardSdkError):
    """No Sweep of that name in the namespace."""


def get_sweep(namespace: str, name: str) -> dict[str, Any]:
    body = k8s.get_or_none(k8s.SWEEPS, namespace, name)
    if body is None:
        raise SweepNotFound(f"Sweep {namespace}/{name} not found")
    return body


def submit(
    experiment: Experiment, config: HyperDriveConfig, tags: dict[str, str] | None
) -> HyperDriveRun:
    """Store the trial's source and environment, create the Sweep, follow it."""
    trial = experiment._trial_spec(config.run_config)
    name = experiment._new_name(sweep_api.SWEEP_NAME_MAX)
    body = sweep_manifest(config, trial, experiment._metadata(name, tags))
    k8s.create(body)
    ns = experiment.workspace.namespace
    print(f"Sweep {ns}/{name} submitted (experiment {experiment.name})", file=sys.stderr)
    return HyperDriveRun(experiment, name)


@dataclass(frozen=True)
class Trial:
    """One trial as the ledger (or, without it, the status) holds it."""

    name: str
    index: int
    state: str
    parameters: dict[str, str]
    history: list[float] = field(default_factory=list)  # the metric's values, by interval
    best: float | None = None
    reason: str = ""


def _best(values: list[float], goal: str) -> float | None:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return None
    return max(finite) if goal == "maximize" else min(finite)


def trials_of(sweep: dict[str, Any], ledger: dict[str, Any] | None) -> list[Trial]:
    """Every trial, by index: from the ledger's entries (``t<index>``: JSON), or from the
    status's summary rows when there is no ledger yet."""
    name = sweep["metadata"]["name"]
    goal = sweep["spec"]["objective"]["goal"]
    out: dict[int, Trial] = {}
    for key, text in ((ledger or {}).get("data") or {}).items():
        if not (key.startswith("t") and key[1:].isdigit()):
            continue
        try:
            raw = json.loads(text)
            history = [float(v) for _, v in raw.get("history", []) if v is not None]
            parameters = {k: format_value(v) for k, v in (raw.get("parameters") or {}).items()}
        except (ValueError, TypeError, AttributeError):
            continue
        index = int(key[1:])
        out[index] = Trial(
            names.trial(name, index),
            index,
            str(raw.get("state") or "Pending"),
            parameters,
            history,
            _best(history, goal),
            str(raw.get("reason") or ""),
        )
    status = sweep.get("status") or {}
    for row in [*(status.get("summary") or []), *([status["best"]] if status.get("best") else [])]:
        if row["index"] not in out:
            metric = row.get("metric")
            out[row["index"]] = Trial(
                row["name"],
                row["index"],
                row.get("state", "Pending"),
                dict(row.get("parameters") or {}),
                [] if metric is None else [float(metric)],
                metric,
                row.get("reason") or "",
            )
    return [out[i] for i in sorted(out)]


def ranked(trials: list[Trial], goal: str) -> list[Trial]:
    """Best first (by the goal); trials without a metric last, by index."""
    sign = -1.0 if goal == "maximize" else 1.0
    with_metric = sorted(
        (t for t in trials if t.best is not None), key=lambda t: (sign * (t.best or 0.0), t.index)
    )
    return with_metric + [t for t in trials if t.best is None]


def summary_line(sweep: dict[str, Any]) -> str:
    """The phase, the trial counts and the best trial in one line."""
    st = sweep.get("status") or {}
    counts = st.get("trials") or {}
    shown = ", ".join(
        f"{counts[k]} {k}"
        for k in ("pending", "running", "completed", "stopped", "failed", "canceled")
        if counts.get(k)
    )
    made = f"{counts.get('created', 0)}/{counts.get('planned', '?')} trials made"
    line = f"{st.get('phase') or 'Pending'} ({made}"
    line += f": {shown})" if shown else ")"
    best = st.get("best")
    if best and best.get("metric") is not None:
        metric = sweep["spec"]["objective"]["metric"]
        line += f"; best {best['name']} {metric} {best['metric']:.6g}"
    return line


def outcome(sweep: dict[str, Any]) -> str:
    """The message of the condition the sweep finished with."""
    st = sweep.get("status") or {}
    for cond in st.get("conditions") or []:
        if cond.get("type") == st.get("phase") and cond.get("status") == "True":
            return f"Sweep {sweep['metadata']['name']} {st['phase']}: {cond.get('message', '')}"
    return f"Sweep {sweep['metadata']['name']} {st.get('phase') or 'Pending'}"


class HyperDriveRun:
    """The run of a HyperDriveConfig: the Sweep ``run_id`` of the experiment's namespace."""

    def __init__(self, experiment: Experiment, run_id: str) -> None:
        self.experiment = experiment
        self.id = run_id
        self.name = run_id

    @property
    def _ns(self) -> str:
        return self.experiment.workspace.namespace

    def _body(self) -> dict[str, Any]:
        return get_sweep(self._ns, self.id)

    def _trials(self) -> tuple[dict[str, Any], list[Trial]]:
        body = self._body()
        ledger = k8s.get_or_none(k8s.CONFIGMAPS, self._ns, names.sweep_trials(self.id))
        return body, trials_of(body, ledger)

    def get_status(self) -> str:
        """Queued, Running, Completed, Failed, or Canceled once ``cancel`` took effect."""
        st = self._body().get("status") or {}
        if st.get("phase") == "Failed" and _reason(st) == sweep_api.CANCELED_REASON:
            return "Canceled"
        return STATUS.get(st.get("phase") or "Pending", "NotStarted")

    def get_details(self) -> dict[str, Any]:
        body = self._body()
        st = body.get("status") or {}
        objective = body["spec"]["objective"]
        return {
            "runId": self.id,
            "status": self.get_status(),
            "startTimeUtc": st.get("startTime"),
            "endTimeUtc": st.get("completionTime"),
            "properties": {
                "namespace": self._ns,
                "primary_metric_config": {"name": objective["metric"], "goal": objective["goal"]},
                "best_child_run_id": (st.get("best") or {}).get("name"),
                "trials": st.get("trials") or {},
            },
            "runDefinition": body["spec"],
        }

    def wait_for_completion(
        self,
        show_output: bool = False,
        wait_post_processing: bool = False,
        raise_on_error: bool = True,
        *,
        poll: float = 5.0,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Until the sweep Succeeds or Fails (``show_output``: a line whenever its trial
        counts or best trial change). A Failed sweep raises ActivityFailedException with
        its reason (``raise_on_error``)."""
        deadline = time.monotonic() + timeout if timeout else None
        last = ""
        while True:
            body = self._body()
            line = summary_line(body)
            if show_output and line != last:
                print(f"Sweep {self.id}: {line}", flush=True)
            last = line
            if (body.get("status") or {}).get("phase") in TERMINAL:
                break
            if deadline and time.monotonic() > deadline:
                raise TimeoutError(f"Sweep {self.id} did not finish within {timeout:.0f}s")
            time.sleep(poll)
        if show_output:
            print(outcome(body))
        if body["status"]["phase"] == "Failed" and raise_on_error:
            raise ActivityFailedException(outcome(body))
        return self.get_details()

    def get_children(self) -> list[Run]:
        """Every trial's run, by index."""
        return [Run(self.experiment, t.name) for t in self._trials()[1]]

    def get_children_sorted_by_primary_metric(
        self, top: int = 0, reverse: bool = False, discard_no_metric: bool = False
    ) -> list[dict[str, Any]]:
        """The trials best first (``reverse``: worst first; those without the metric
        last either way, or left out with ``discard_no_metric``), the first ``top`` (0:
        all), as Azure ML's dicts: run_id, hyperparameters (as the trial received them),
        best_primary_metric, status; and torchyard's ``state`` and ``reason``."""
        body, trials = self._trials()
        order = ranked(trials, body["spec"]["objective"]["goal"])
        scored = [t for t in order if t.best is not None]
        unscored = [] if discard_no_metric else [t for t in order if t.best is None]
        order = (scored[::-1] if reverse else scored) + unscored
        rows = [
            {
                "run_id": t.name,
                "hyperparameters": dict(t.parameters),
                "best_primary_metric": t.best,
                "status": CHILD_STATUS.get(t.state, t.state),
                "state": t.state,
                "reason": t.reason,
            }
            for t in order
        ]
        return rows[:top] if top else rows

    def get_best_run_by_primary_metric(
        self,
        include_failed: bool = True,
        include_canceled: bool = True,
        include_resume_from_runs: bool = True,
    ) -> Run | None:
        """The trial with the best metric any trial reported, as its :class:`Run` (None
        while none reported it). ``include_canceled=False`` leaves out the trials the
        policy stopped and those canceled. (No trial is resumed from another run, so
        ``include_resume_from_runs`` changes nothing.)"""
        body, trials = self._trials()
        left_out = set()
        if not include_failed:
            left_out.add("Failed")
        if not include_canceled:
            left_out |= {"Stopped", "Canceled"}
        order = ranked(
            [t for t in trials if t.state not in left_out], body["spec"]["objective"]["goal"]
        )
        if not order or order[0].best is None:
            return None
        return Run(self.experiment, order[0].name)

    def get_metrics(self) -> dict[str, dict[str, list[float]]]:
        """The primary metric of each trial, its values by interval: {trial: {metric: [...]}}."""
        body, trials = self._trials()
        metric = body["spec"]["objective"]["metric"]
        return {t.name: {metric: list(t.history)} for t in trials}

    def cancel(self) -> None:
        """Cancel the sweep (``spec.cancel: true``): the controller cancels the trials
        still running and the sweep ends Failed, reason Canceled, with the best trial
        found so far."""
        body = self._body()
        if (body.get("status") or {}).get("phase") in TERMINAL and (body.get("status") or {}).get(
            "completionTime"
        ):
            raise TorchyardSdkError(
                f"Sweep {self._ns}/{self.id} already finished ({body['status']['phase']})"
            )
        patch = {
            "apiVersion": api.API_VERSION,
            "kind": "Sweep",
            "metadata": {"name": self.id, "namespace": self._ns},
            "spec": {"cancel": True},
        }
        k8s.apply(patch, field_manager=FIELD_MANAGER)

    def __repr__(self) -> str:
        return f"HyperDriveRun(id={self.id!r}, namespace={self._ns!r})"


def _reason(st: dict[str, Any]) -> str | None:
    for cond in st.get("conditions") or []:
        if cond.get("type") == st.get("phase"):
            return str(cond.get("reason") or "")
    return None


__all__ = ["HyperDriveRun"]
