"""``Experiment`` and ``Run``: ``Experiment.submit(ScriptRunConfig)`` snapshots the source
folder (as ``torchyard submit --source`` does) and creates a ``TrainingRun`` labelled with
the experiment (with ``compute_target="local"``, or none, as in Azure ML, it runs on this
machine instead: ``local_target``); a ``Run`` follows it (``get_status``, ``get_details``,
``wait_for_completion``), reads its archived files (``get_file_names``,
``download_file``) and registers a model from it (``register_model``, in ``models``).
Tested in tests/unit/sdk/test_azureml*.py and tests/integration/test_azureml.py.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchyard import api, k8s, progress
from torchyard.api import wire
from torchyard.launch.contract import INPUT_VARIABLE_PREFIX
from torchyard.sdk import runs, snapshots, suspension
from torchyard.sdk.azureml import models
from torchyard.sdk.azureml.common import (
    ActivityFailedException,
    TorchyardSdkError,
    dns_name,
    refuse,
)
from torchyard.sdk.azureml.compute import ComputeTarget
from torchyard.sdk.azureml.hyperdrive import HyperDriveConfig
from torchyard.sdk.azureml.run_configs import ScriptRunConfig

if TYPE_CHECKING:
    from torchyard.sdk.azureml.workspaces import Workspace

# Azure run states by torchyard phase.
STATUS = {
    "Pending": "Queued",
    "Preparing": "Preparing",
    "Queued": "Queued",
    "Running": "Running",
    "Finalizing": "Finalizing",
    "Succeeded": "Completed",
    "Failed": "Failed",
    "Suspended": "Suspended",
}


class Experiment:
    def __init__(self, workspace: Workspace, name: str) -> None:
        self.workspace = workspace
        self.name = name

    def submit(
        self, config: ScriptRunConfig | HyperDriveConfig, tags: dict[str, str] | None = None
    ) -> Any:
        """A ScriptRunConfig: a TrainingRun, followed by the :class:`Run` returned; a
        HyperDriveConfig: a Sweep whose trials run its ScriptRunConfig, followed by the
        ``HyperDriveRun`` returned (``hyperdrive_runs``)."""
        from torchyard.sdk.azureml import (  # (they import this module)
            hyperdrive_runs,
            local_hyperdrive,
            local_target,
        )

        if isinstance(config, HyperDriveConfig):
            if local_target.is_local(config.run_config.compute_target):
                return local_hyperdrive.submit(self, config, tags)
            return self._to_cluster(lambda: hyperdrive_runs.submit(self, config, tags))
        if not isinstance(config, ScriptRunConfig):
            raise TorchyardSdkError(
                f"Experiment.submit takes a ScriptRunConfig or a HyperDriveConfig, not "
                f"{type(config).__name__}"
            )
        if local_target.is_local(config.compute_target):
            return local_target.submit(self, config, tags)
        return self._to_cluster(lambda: self._submit(config, tags))

    def _to_cluster(self, submit: Any) -> Any:
        """``submit()``, with a cluster that cannot be reached said as what to do."""
        try:
            return submit()
        except k8s.Unreachable as err:
            raise TorchyardSdkError(
                f"{err}; to run on this machine instead, use ScriptRunConfig(..., "
                "compute_target='local')"
            ) from None

    def _submit(self, config: ScriptRunConfig, tags: dict[str, str] | None) -> Run:
        ns = self.workspace.namespace
        name = self._new_name()
        body = {
            "apiVersion": api.API_VERSION,
            "kind": "TrainingRun",
            "metadata": self._metadata(name, tags),
            "spec": self._trial_spec(config),
        }
        api.parse_trainingrun(body)
        k8s.create(body)
        print(f"TrainingRun {ns}/{name} submitted (experiment {self.name})", file=sys.stderr)
        return Run(self, name)

    def _new_name(self, limit: int = 47) -> str:
        """``<experiment>-<6 hex digits>``, at most ``limit`` characters."""
        exp = dns_name(self.name)[: min(40, limit - 7)].rstrip("-")
        return f"{exp}-{secrets.token_hex(3)}"

    def _metadata(self, name: str, tags: dict[str, str] | None) -> dict[str, Any]:
        return {
            "name": name,
            "namespace": self.workspace.namespace,
            "labels": {wire.LABEL_EXPERIMENT: dns_name(self.name)[:40].rstrip("-"), **(tags or {})},
            "annotations": {wire.ANNOTATION_EXPERIMENT_NAME: self.name},
        }

    def _trial_spec(self, config: ScriptRunConfig) -> dict[str, Any]:
        """Register the environment and store the source snapshot (the side effects),
        then the TrainingRun spec (:func:`run_spec`)."""
        ws = self.workspace
        env = config.environment
        env_name = "default"
        if env is not None:
            if not env._registered or env.python.conda_yaml or env.python.pip_requirements:
                env.register(ws)
            env_name = dns_name(env.name)
        snap = snapshots.snapshot(Path(config.source_directory))
        try:
            print(snap.report(), file=sys.stderr)
            snapshots.store(snap, ws.namespace, ws.registry)
            source = snap.source
        finally:
            snap.close()
        target = config.compute_target
        if isinstance(target, str):
            target = ComputeTarget(ws, target)
        return run_spec(config, env_name, source, target, service_account=ws.service_account)


def run_spec(
    config: ScriptRunConfig,
    environment: str,
    source: dict[str, Any],
    target: ComputeTarget | None = None,
    *,
    service_account: str | None = None,
) -> dict[str, Any]:
    """The TrainingRun spec a ScriptRunConfig stands for, given its registered
    ``environment``'s name, its stored snapshot's ``source`` and its compute ``target``
    looked up (no I/O): a plain run's
    spec, and a sweep's ``spec.trial``."""
    env = config.environment
    python = env.python.interpreter_path if env else "python"
    command = (
        [*(str(c) for c in config.command), *config.arguments]
        if config.command
        else [python, str(config.script), *config.arguments]
    )
    dist = config._distribution()
    spec: dict[str, Any] = {
        "environment": environment,
        "source": source,
        "command": command,
        "distribution": dist,
    }
    if target is not None:
        spec["compute"] = {"pool": target.pool}
        if target.gpus_per_node:
            per_node = dist["processCountPerNode"] if dist.get("launch") != "node" else 1
            spec["resources"] = {"gpusPerNode": min(per_node, target.gpus_per_node)}
    if config.max_run_duration_seconds:
        spec["policy"] = {"activeDeadlineSeconds": config.max_run_duration_seconds}
    if config.inputs:
        spec["inputs"] = [{k: v for k, v in i.to_dict().items() if v != []} for i in config.inputs]
    if service_account:
        # The node Pods run as it, so their registry token is its (item: serviceAccount).
        spec["serviceAccountName"] = service_account
    return spec


class ScriptRun:
    """The run a training script is part of (``Run.get_context()``): its ``log`` is
    ``torchyard.progress.log``, whose values reach ``status.progress.metrics``,
    logs/metrics.jsonl and the registered ModelVersion's metrics."""

    @property
    def input_datasets(self) -> dict[str, str]:
        """~ Azure ML ``run.input_datasets``: each input's folder, by name."""
        prefix = INPUT_VARIABLE_PREFIX
        return {k[len(prefix) :].lower(): v for k, v in os.environ.items() if k.startswith(prefix)}

    def log(self, name: str, value: Any, *, step: int | None = None) -> None:
        """~ Azure ML ``run.log(name, value)``: one metric value at the last reported
        step (``step``: at that one)."""
        progress.log(name, value, step=step)


class RunHandle:
    """What a run object of an experiment holds: the experiment, and the name of the
    object (a TrainingRun, a Sweep) in the experiment's namespace."""

    POLL_SECONDS = 1.0  # how often wait_for_completion looks, unless told

    def __init__(self, experiment: Experiment, run_id: str) -> None:
        self.experiment = experiment
        self.id = run_id
        self.name = run_id

    @property
    def _ns(self) -> str:
        return self.experiment.workspace.namespace

    def get_details(self) -> dict[str, Any]:
        """~ Azure ML ``run.get_details()``: the run's id, status, times and definition."""
        raise NotImplementedError

    def wait_for_completion(
        self,
        show_output: bool = False,
        wait_post_processing: bool = False,
        raise_on_error: bool = True,
        *,
        poll: float | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Until the run ended (``show_output``: what it does as it goes, then how it
        ended), then its details; one that failed raises ActivityFailedException saying
        why (``raise_on_error``). ``poll``: seconds between looks (default
        ``POLL_SECONDS``); ``timeout``: TimeoutError once that many seconds passed. A run
        ends only after its post-processing (outputs archived, model registered), so this
        always waits for it, as ``wait_post_processing=True`` asks."""
        failed, text = self._wait(show_output, self.POLL_SECONDS if poll is None else poll, timeout)
        if show_output:
            print(text)
        if failed and raise_on_error:
            raise ActivityFailedException(text)
        return self.get_details()

    def _wait(self, show_output: bool, poll: float, timeout: float | None) -> tuple[bool, str]:
        """Until the run ended: (whether it failed, the text saying how it ended)."""
        raise NotImplementedError


class Run(RunHandle):
    @staticmethod
    def get_context() -> ScriptRun:
        """~ Azure ML ``Run.get_context()`` inside a training script."""
        return ScriptRun()

    def _body(self) -> dict[str, Any]:
        return runs.get(self._ns, self.id)

    def get_status(self) -> str:
        return STATUS.get(self._body().get("status", {}).get("phase", "Pending"), "NotStarted")

    def get_details(self) -> dict[str, Any]:
        body = self._body()
        st = body.get("status", {})
        details: dict[str, Any] = {
            "runId": self.id,
            "target": (body["spec"].get("compute") or {}).get("pool"),
            "status": STATUS.get(st.get("phase", "Pending"), "NotStarted"),
            "startTimeUtc": st.get("startTime"),
            "endTimeUtc": st.get("completionTime"),
            "properties": {"namespace": self._ns, "environment": body["spec"]["environment"]},
            "runDefinition": body["spec"],
        }
        if st.get("phase") == "Failed":
            details["error"] = {"message": runs.failure_text(body)}
        return details

    def _wait(self, show_output: bool, poll: float, timeout: float | None) -> tuple[bool, str]:
        body = runs.wait(
            self._ns,
            self.id,
            show_output=show_output,
            poll=poll,
            timeout=timeout,
            registry=self.experiment.workspace.registry,
        )
        code, text = runs.outcome(body)
        return code != 0, text

    def suspend(self) -> None:
        """Checkpoint now, stop the node Pods and free their capacity (spec.suspend)."""
        suspension.suspend(self._ns, self.id)

    def resume(self) -> None:
        """Admit the suspended run again; it continues from its newest checkpoint."""
        suspension.resume(self._ns, self.id)

    def get_file_names(self) -> list[str]:
        return self.experiment.workspace.registry().run_files(self._ns, self.id)

    def download_file(self, name: str, output_file_path: str | None = None) -> None:
        dest = Path(output_file_path or Path(name).name)
        if dest.is_dir():
            dest = dest / Path(name).name
        self.experiment.workspace.registry().download_run_file(self._ns, self.id, name, dest)

    def register_model(
        self,
        model_name: str,
        model_path: str | None = None,
        tags: dict[str, str] | None = None,
        properties: dict[str, Any] | None = None,
        model_framework: str | None = None,
        model_framework_version: str | None = None,
        description: str | None = None,
        datasets: Any = None,
        sample_input_dataset: Any = None,
        sample_output_dataset: Any = None,
        resource_configuration: Any = None,
    ) -> models.Model:
        """Promote ``model_path`` of the run's archive (default: outputs) to the model's
        next version, recorded as the ModelVersion ``<model>-v<N>``; tags, properties,
        description and the framework go into the version's manifest."""
        refuse(
            "register_model",
            {
                "datasets": (datasets, None),
                "sample_input_dataset": (sample_input_dataset, None),
                "sample_output_dataset": (sample_output_dataset, None),
                "resource_configuration": (resource_configuration, None),
            },
            "torchyard has no datasets or deployment resources: keep such notes in "
            "properties= (recorded in the version's manifest)",
        )
        wanted = models.Registration(
            model_name,
            model_path or "outputs",
            tags=tags or {},
            properties=properties or {},
            framework=(model_framework or "", model_framework_version or ""),
            description=description or "",
        )
        return self._register(wanted)

    def _register(self, wanted: models.Registration) -> models.Model:
        """The registration itself: promoted by the registry service, recorded as a
        ModelVersion (a local run's: ``local_target``)."""
        return models.register(self, wanted)

    def __repr__(self) -> str:
        return f"Run(id={self.id!r}, namespace={self._ns!r})"


__all__ = ["Experiment", "Run"]
