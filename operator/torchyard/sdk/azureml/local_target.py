"""The local compute target: ``ScriptRunConfig(..., compute_target="local")`` (or no
compute target at all, as in Azure ML) runs on this machine through local mode, with the
cluster's rank contract, outputs and logs archived into the local registry
(``~/.torchyard/registry``) and the run recorded there, so ``torchyard runs list --local``
and ``torchyard models list --local`` see what the SDK did.

:func:`submit` starts the run in a thread of its own and returns a :class:`LocalScriptRun`
at once, as ``Experiment.submit`` does; what the run prints goes to a transcript file that
``wait_for_completion(show_output=True)`` follows. ``get_status``, ``get_details``,
``get_metrics`` (what the ranks logged with ``run.log`` / ``torchyard.progress``),
``get_file_names``, ``download_file`` and ``register_model`` (the local registry's next
version) read the run's archive (HyperDrive's trials: ``local_hyperdrive``). Ctrl-C
while waiting stops the run as ``torchyard run --local`` does; a run still going when the
script ends is waited for. Called by ``experiments.Experiment.submit``; tested in
tests/unit/sdk/test_local_target.py and tests/e2e/test_guide_locally.py.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from torchyard import api
from torchyard.launch.contract import NOT_METRICS, rank0_records
from torchyard.local import LocalRun
from torchyard.sdk import local_runs
from torchyard.sdk.azureml import models
from torchyard.sdk.azureml.common import TorchyardSdkError, dns_name
from torchyard.sdk.azureml.experiments import STATUS, Run, RunHandle, run_spec
from torchyard.sdk.azureml.run_configs import ScriptRunConfig
from torchyard.sdk.local_registry import LocalRegistry
from torchyard.sdk.registry import RegistryError

if TYPE_CHECKING:
    from torchyard.sdk.azureml.experiments import Experiment

# What Azure ML accepts as the local compute target's name.
LOCAL_TARGETS = ("local",)
FOLLOW_SECONDS = 0.2  # how often wait_for_completion reads the transcript


def is_local(target: Any) -> bool:
    """Whether a ScriptRunConfig's ``compute_target`` means this machine."""
    return target is None or (isinstance(target, str) and target.lower() in LOCAL_TARGETS)


class Execution:
    """A local run (or sweep) going on in a thread of its own, its output in a transcript."""

    def __init__(self, transcript: Path, work: Callable[[IO[str]], Any]) -> None:
        self.transcript = transcript
        self.result: Any = None
        self.error: BaseException | None = None
        self.stop: Callable[[], None] = lambda: None  # set by what runs
        transcript.parent.mkdir(parents=True, exist_ok=True)
        self._out = transcript.open("w", buffering=1)

        def run() -> None:
            try:
                self.result = work(self._out)
            except BaseException as err:
                self.error = err
            finally:
                self._out.close()

        self.thread = threading.Thread(target=run, name=f"torchyard {transcript.stem}")
        self.thread.start()
        _RUNNING.append(self)

    @property
    def running(self) -> bool:
        return self.thread.is_alive()

    def follow(
        self, show_output: bool, poll: float = FOLLOW_SECONDS, timeout: float | None = None
    ) -> None:
        """Until it ends (with ``show_output``, what it prints, as it comes, read every
        ``poll`` seconds); Ctrl-C stops it as it would stop ``torchyard run --local``, then
        raises KeyboardInterrupt; after ``timeout`` seconds, TimeoutError (it goes on)."""
        deadline = time.monotonic() + timeout if timeout else None
        read = 0
        try:
            while True:
                alive = self.running
                if show_output:
                    read = self._show(read)
                if not alive:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{self.transcript.stem} did not finish within {timeout:.0f}s "
                        "(it goes on on this machine)"
                    )
                time.sleep(poll)
        except KeyboardInterrupt:
            print("[torchyard] interrupted: stopping the local run", file=sys.stderr)
            self.stop()
            self.thread.join()
            if show_output:
                self._show(read)
            raise

    def _show(self, offset: int) -> int:
        with self.transcript.open("rb") as f:
            f.seek(offset)
            data = f.read()
        end = data.rfind(b"\n") + 1 if self.running else len(data)
        if end:
            sys.stdout.write(data[:end].decode("utf-8", "replace"))
            sys.stdout.flush()
        return offset + end


_RUNNING: list[Execution] = []


@atexit.register
def _wait_for_the_rest() -> None:
    """A script that ends while its local runs go on: they end first (their nodes run in
    sessions of their own and would be left behind)."""
    for execution in _RUNNING:
        if execution.running:
            print(
                f"[torchyard] waiting for {execution.transcript.stem} to end (Ctrl-C stops it)",
                file=sys.stderr,
            )
            try:
                execution.thread.join()
            except KeyboardInterrupt:
                execution.stop()
                execution.thread.join()


def registry_of(experiment: Experiment) -> LocalRegistry:
    return experiment.workspace.local_registry()


def environment_of(config: ScriptRunConfig) -> tuple[str, api.Environment | None]:
    """The run's Environment name, and what local mode checks of it in this Python (its
    pip packages): a local run uses this Python, nothing is built."""
    env = config.environment
    if env is None:
        return "default", None
    name = dns_name(env.name)
    body = {
        "apiVersion": api.API_VERSION,
        "kind": "Environment",
        "metadata": {"name": name},
        # (never applied or built: local mode only reads its pip packages)
        "spec": {
            "baseImage": env.docker.base_image or "python:3.11-slim",
            "registry": {"repository": "local.invalid/unused"},
        }
        | ({"pip": list(env.python.pip_requirements)} if env.python.pip_requirements else {}),
    }
    if env.python.conda_yaml:
        print(
            f"[torchyard] Environment {env.name}: a local run uses this Python "
            f"({sys.executable}); its conda packages are not installed here",
            file=sys.stderr,
        )
    return name, api.parse_environment(body)


def spec_of(config: ScriptRunConfig, env_name: str, config_env: Any) -> dict[str, Any]:
    spec = run_spec(config, env_name, {"image": True})
    variables = dict(getattr(config_env, "environment_variables", None) or {})
    if variables:
        spec["env"] = [{"name": k, "value": str(v)} for k, v in sorted(variables.items())]
    return spec


def submit(experiment: Experiment, config: ScriptRunConfig, tags: dict[str, str] | None) -> Run:
    """Start ``config`` on this machine; the run to follow."""
    name = experiment._new_name()
    env_name, environment = environment_of(config)
    body = {
        "apiVersion": api.API_VERSION,
        "kind": "TrainingRun",
        "metadata": experiment._metadata(name, tags),
        "spec": spec_of(config, env_name, config.environment),
    }
    run = api.parse_trainingrun(body)
    registry = registry_of(experiment).root
    workroot = local_runs.default_workroot()
    source = local_runs.collect_source(Path(config.source_directory), registry, workroot)
    made: list[LocalRun] = []

    def work(out: IO[str]) -> Any:
        out.write(f"[torchyard] {source.report()}\n")
        local = LocalRun(
            run,
            source.root,
            source.files,
            environment,
            store_root=registry,
            workroot=workroot,
            out=out,
            grace=10,
            stdout=out,
        )
        made.append(local)
        return local.execute()

    transcript = workroot / "sdk" / f"{run.namespace}-{name}.txt"
    execution = Execution(transcript, work)
    execution.stop = lambda: made[0].interrupt() if made else None
    ns = experiment.workspace.namespace
    print(f"TrainingRun {ns}/{name} started on this machine (experiment {experiment.name})",
          file=sys.stderr)  # fmt: skip
    return LocalScriptRun(experiment, name, execution)


class InThisProcess(RunHandle):
    """What a run of the local compute target (a TrainingRun or a Sweep) adds to its
    cluster class: going on in this process (``execution``), or one that ended, read
    from its record; waiting follows what it prints."""

    POLL_SECONDS = FOLLOW_SECONDS

    def __init__(
        self, experiment: Experiment, run_id: str, execution: Execution | None = None
    ) -> None:
        super().__init__(experiment, run_id)
        self.execution = execution

    @property
    def _running(self) -> bool:
        return self.execution is not None and self.execution.running

    def _running_body(self) -> dict[str, Any]:
        """What the run shows while it runs (its record comes when it ended)."""
        return {"metadata": {"name": self.id}, "spec": {}, "status": {"phase": "Running"}}

    def _follow(self, show_output: bool, poll: float, timeout: float | None) -> None:
        """Until it ended (``show_output``: what it printed, as it came); a Ctrl-C that
        stopped it is raised again."""
        if self.execution is not None:
            self.execution.follow(show_output, poll, timeout)
            if isinstance(self.execution.error, KeyboardInterrupt):
                raise self.execution.error

    def _error(self) -> str:
        """``: <why>`` when its thread ended with an error, else ''."""
        error = self.execution.error if self.execution is not None else None
        return f": {error}" if error is not None else ""


class LocalScriptRun(InThisProcess, Run):
    """A run of the local compute target (see the module docstring)."""

    def _record(self) -> dict[str, Any] | None:
        found = registry_of(self.experiment).get_record(self._ns, self.id)
        return dict(found) if found is not None else None

    def _body(self) -> dict[str, Any]:
        if self._running:
            return self._running_body()
        record = self._record()
        if record is None:
            raise TorchyardSdkError(f"local run {self.id} left no record{self._error()}")
        return {
            "metadata": {"name": self.id, "namespace": self._ns, "uid": record.get("uid")},
            "spec": record.get("spec") or {},
            "status": record.get("status") or {},
        }

    def get_status(self) -> str:
        return STATUS.get(self._body()["status"].get("phase", "Pending"), "NotStarted")

    def get_details(self) -> dict[str, Any]:
        body = self._body()
        st = body["status"]
        details: dict[str, Any] = {
            "runId": self.id,
            "target": "local",
            "status": STATUS.get(st.get("phase", "Pending"), "NotStarted"),
            "startTimeUtc": st.get("startTime"),
            "endTimeUtc": st.get("completionTime"),
            "properties": {"namespace": self._ns, "environment": body["spec"].get("environment")},
            "runDefinition": body["spec"],
        }
        failure = st.get("failure") or {}
        if st.get("phase") == "Failed":
            details["error"] = {"message": str(failure.get("message") or failure.get("reason"))}
        return details

    def _wait(self, show_output: bool, poll: float, timeout: float | None) -> tuple[bool, str]:
        self._follow(show_output, poll, timeout)
        details = self.get_details()
        if details["status"] == "Completed":
            return False, f"TrainingRun {self.id} succeeded on this machine"
        message = (details.get("error") or {}).get("message") or "it failed"
        return True, f"TrainingRun {self.id} failed on this machine: {message}"

    def cancel(self) -> None:
        """Stop the run (as Ctrl-C does): its nodes stop, it is recorded Interrupted."""
        if self.execution is not None and self._running:
            self.execution.stop()
            self.execution.thread.join()

    def get_metrics(self) -> dict[str, Any]:
        """~ Azure ML ``run.get_metrics()``: each metric rank 0 logged (``run.log``,
        ``torchyard.progress``), its value, or its values in order when it logged it more
        than once."""
        try:
            text = registry_of(self.experiment).read_run_file(
                self._ns, self.id, "logs/node-0/metrics.jsonl"
            )
        except RegistryError:
            return {}
        values: dict[str, list[Any]] = {}
        for record in rank0_records(text):
            for key, value in record.items():
                if key not in NOT_METRICS:
                    values.setdefault(key, []).append(value)
        return {k: v[0] if len(v) == 1 else v for k, v in values.items()}

    def get_file_names(self) -> list[str]:
        return registry_of(self.experiment).run_files(self._ns, self.id)

    def download_file(self, name: str, output_file_path: str | None = None) -> None:
        dest = Path(output_file_path or Path(name).name)
        if dest.is_dir():
            dest = dest / Path(name).name
        registry_of(self.experiment).download_run_file(self._ns, self.id, name, dest)

    def suspend(self) -> None:
        raise TorchyardSdkError("a local run cannot be suspended: cancel() stops it")

    def resume(self) -> None:
        raise TorchyardSdkError("a local run resumes when it is run again (local mode)")

    def _register(self, wanted: models.Registration) -> models.Model:
        """``register_model`` into the local registry: ``model_path`` of the run's archive
        as the model's next version, with the metadata every registration has."""
        body = self._body()
        models.require_succeeded(self.id, body)
        registry = registry_of(self.experiment)
        archive = registry.run_dir(self._ns, self.id)
        source = (archive / wanted.model_path).resolve()
        if not source.is_relative_to(archive.resolve()) or not source.exists():
            raise TorchyardSdkError(
                f"run {self.id} archived no {wanted.model_path!r} (its files: run.get_file_names())"
            )
        spec = api.parse_trainingrun({"apiVersion": api.API_VERSION, "kind": "TrainingRun", **body})
        meta = wanted.metadata(spec, "", local=True)
        model = wanted.model
        made = registry.store.publish(self._ns, model, source, metadata=meta, within=archive)
        return models.Model(
            self.experiment.workspace, model, made.version, made.manifest, registry=registry
        )

    def __repr__(self) -> str:
        return f"Run(id={self.id!r}, namespace={self._ns!r}, target='local')"


__all__: list[str] = []  # reached through Experiment.submit
