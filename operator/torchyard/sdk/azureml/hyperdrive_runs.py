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

import sys
import time
from typing import TYPE_CHECKING, Any

from torchyard import k8s
from torchyard.api import sweeps as sweep_api
from torchyard.sdk import sweeps as sdk_sweeps
from torchyard.sdk.azureml.common import TorchyardSdkError
from torchyard.sdk.azureml.experiments import Run, RunHandle
from torchyard.sdk.azureml.hyperdrive import HyperDriveConfig, sweep_manifest

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


class HyperDriveRun(RunHandle):
    """The run of a HyperDriveConfig: the Sweep ``run_id`` of the experiment's namespace."""

    POLL_SECONDS = 5.0

    def _body(self) -> dict[str, Any]:
        try:
            return sdk_sweeps.get(self._ns, self.id)
        except sdk_sweeps.SweepNotFound as err:
            raise TorchyardSdkError(str(err)) from None

    def _trials(self) -> tuple[dict[str, Any], list[sdk_sweeps.Trial]]:
        body = self._body()
        return body, sdk_sweeps.trials_of(body, sdk_sweeps.ledger(self._ns, self.id))

    def get_status(self) -> str:
        """Queued, Running, Completed, Failed, or Canceled once ``cancel`` took effect."""
        body = self._body()
        if sdk_sweeps.canceled(body):
            return "Canceled"
        st = body.get("status") or {}
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

    def _wait(self, show_output: bool, poll: float, timeout: float | None) -> tuple[bool, str]:
        """Until the sweep Succeeds or Fails (``show_output``: a line whenever its trial
        counts or best trial change); a Failed sweep's outcome says its reason."""
        deadline = time.monotonic() + timeout if timeout else None
        last = ""
        while True:
            body = self._body()
            line = sdk_sweeps.summary_line(body)
            if show_output and line != last:
                print(f"Sweep {self.id}: {line}", flush=True)
            last = line
            if (body.get("status") or {}).get("phase") in sdk_sweeps.TERMINAL:
                break
            if deadline and time.monotonic() > deadline:
                raise TimeoutError(f"Sweep {self.id} did not finish within {timeout:.0f}s")
            time.sleep(poll)
        return body["status"]["phase"] == "Failed", sdk_sweeps.outcome(body)

    def _child(self, name: str) -> Run:
        """The run of the trial TrainingRun ``name``."""
        return Run(self.experiment, name)

    def get_children(self) -> list[Run]:
        """Every trial's run, by index."""
        return [self._child(t.name) for t in self._trials()[1]]

    def get_children_sorted_by_primary_metric(
        self, top: int = 0, reverse: bool = False, discard_no_metric: bool = False
    ) -> list[dict[str, Any]]:
        """The trials best first (``reverse``: worst first; those without the metric
        last either way, or left out with ``discard_no_metric``), the first ``top`` (0:
        all), as Azure ML's dicts: run_id, hyperparameters (as the trial received them),
        best_primary_metric, status; and torchyard's ``state`` and ``reason``."""
        body, trials = self._trials()
        order = sdk_sweeps.ranked(trials, body["spec"]["objective"]["goal"])
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
        while none reported it): ``sdk_sweeps.best``, the rule of the sweep's summary too.
        ``include_failed=False`` leaves out the failed trials, ``include_canceled=False``
        those the policy stopped and those canceled. (No trial is resumed from another
        run, so ``include_resume_from_runs`` changes nothing.)"""
        body, trials = self._trials()
        found = sdk_sweeps.best(body, trials, include_failed, include_canceled)
        return None if found is None else self._child(found.name)

    def get_metrics(self) -> dict[str, dict[str, list[float]]]:
        """The primary metric of each trial, its values by interval: {trial: {metric: [...]}}."""
        body, trials = self._trials()
        metric = body["spec"]["objective"]["metric"]
        return {t.name: {metric: list(t.history)} for t in trials}

    def cancel(self) -> None:
        """Cancel the sweep (``spec.cancel: true``): the controller cancels the trials
        still running and the sweep ends Failed, reason Canceled (``get_status()``:
        Canceled), with the best trial found so far."""
        try:
            sdk_sweeps.cancel(self._ns, self.id)
        except (sdk_sweeps.SweepNotFound, ValueError) as err:
            raise TorchyardSdkError(str(err)) from None

    def __repr__(self) -> str:
        return f"HyperDriveRun(id={self.id!r}, namespace={self._ns!r})"


__all__ = ["HyperDriveRun"]
