"""HyperDrive on the local compute target: a HyperDriveConfig whose ``run_config`` runs
on this machine (``compute_target="local"`` or none) is a Sweep run by local mode
(``local.sweeps``: the same sampling, early termination and verdict as in a cluster),
``max_concurrent_runs`` trials at a time, in a thread of this process whose output
``wait_for_completion(show_output=True)`` follows. The :class:`LocalHyperDriveRun` reads
the sweep's record in the local registry once it finished: its trials ranked,
``get_best_run_by_primary_metric()`` as a ``local_target.LocalScriptRun`` (so
``register_model`` registers into the local registry), ``cancel()`` while it runs.
Called by ``experiments.Experiment.submit``; tested in tests/unit/sdk/test_local_target.py.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from torchyard.api import sweeps as sweep_api
from torchyard.sdk import local_runs
from torchyard.sdk import sweeps as sweep_sdk
from torchyard.sdk.azureml.common import TorchyardSdkError
from torchyard.sdk.azureml.experiments import Run
from torchyard.sdk.azureml.hyperdrive import HyperDriveConfig, sweep_manifest
from torchyard.sdk.azureml.hyperdrive_runs import HyperDriveRun
from torchyard.sdk.azureml.local_target import (
    Execution,
    InThisProcess,
    LocalScriptRun,
    environment_of,
    registry_of,
    spec_of,
)

if TYPE_CHECKING:
    from torchyard.sdk.azureml.experiments import Experiment


def submit(
    experiment: Experiment, config: HyperDriveConfig, tags: dict[str, str] | None
) -> HyperDriveRun:
    """Run a HyperDriveConfig's trials on this machine, ``max_concurrent_runs`` at a time."""
    trial_config = config.run_config
    env_name, environment = environment_of(trial_config)
    name = experiment._new_name(sweep_api.SWEEP_NAME_MAX)
    body = sweep_manifest(
        config,
        spec_of(trial_config, env_name, trial_config.environment),
        experiment._metadata(name, tags),
    )
    registry = registry_of(experiment).root
    workroot = local_runs.default_workroot()
    source = local_runs.collect_source(Path(trial_config.source_directory), registry, workroot)
    parallel = config.max_concurrent_runs or 1
    stop = threading.Event()

    def work(out: IO[str]) -> Any:
        out.write(f"[torchyard] {source.report()}\n")
        return local_runs.sweep(
            body,
            source,
            parallel=parallel,
            registry=registry,
            workroot=workroot,
            environment=environment,
            out=out,
            stop=stop,
        )

    transcript = workroot / "sdk" / f"{experiment.workspace.namespace}-{name}.txt"
    execution = Execution(transcript, work)
    execution.stop = stop.set
    ns = experiment.workspace.namespace
    print(f"Sweep {ns}/{name} started on this machine (experiment {experiment.name})",
          file=sys.stderr)  # fmt: skip
    return LocalHyperDriveRun(experiment, name, execution)


class LocalHyperDriveRun(InThisProcess, HyperDriveRun):
    """A HyperDriveConfig's local sweep: going on in this process, or ended (its record)."""

    def _body(self) -> dict[str, Any]:
        if self._running:
            return self._running_body()
        try:
            return sweep_sdk.recorded_one(registry_of(self.experiment), self._ns, self.id)
        except sweep_sdk.SweepNotFound as err:
            raise TorchyardSdkError(f"{err}{self._error()}") from None

    def _trials(self) -> tuple[dict[str, Any], list[sweep_sdk.Trial]]:
        if self.execution is not None:
            self.execution.thread.join()
        body = self._body()
        return body, sweep_sdk.trials_of(body, None)

    def get_status(self) -> str:
        body = self._body()
        if (body.get("status") or {}).get("phase") == "Running":
            return "Running"
        return "Canceled" if sweep_sdk.canceled(body) else super().get_status()

    def _wait(self, show_output: bool, poll: float, timeout: float | None) -> tuple[bool, str]:
        """Until the sweep finished (``show_output``: what its trials printed)."""
        self._follow(show_output, poll, timeout)
        body = self._body()
        return (body.get("status") or {}).get("phase") == "Failed", sweep_sdk.outcome(body)

    def _child(self, name: str) -> Run:
        return LocalScriptRun(self.experiment, name)

    def cancel(self) -> None:
        """Cancel the sweep: its running trials are canceled and it ends Failed, reason
        Canceled (``get_status()``: Canceled), with the best trial so far."""
        if self.execution is None or not self._running:
            raise TorchyardSdkError(f"Sweep {self.id} already finished")
        self.execution.stop()
        self.execution.thread.join()

    def __repr__(self) -> str:
        return f"HyperDriveRun(id={self.id!r}, namespace={self._ns!r}, target='local')"


__all__: list[str] = []  # reached through Experiment.submit
