"""A Sweep on this machine (``torchyard sweep submit FILE --local``): its trials run
``parallel`` at a time through the local runner (``local.runs``), with the plan, the
sampling, the early-termination decisions and the verdict of a cluster's Sweep
(``torchyard.tuning``, the controller's own modules).

Trial n is the TrainingRun ``<sweep>-t<n>`` the controller would make
(``planning.sweeps.trial``: the parameters as arguments and variables), run by a
:class:`LocalRun` in a thread of its own (with ``parallel`` above 1, each line of its
output starts with its name: the trials' lines interleave). While it runs, node 0's
``logs/metrics.jsonl`` (every progress report of its ranks; rank 0's are read) gives the
objective's metric at each step, added to the trial's ledger entry as the controller
adds what it sees (``sweep_trials.observed``); the book of trials is folded from the
entries and what each trial shows (``sweep_trials.book``), the policy judges it
(``sweep_policy.judge``), and a trial it stops is stopped as in a cluster: its nodes are
asked to stop with their grace period (one with checkpoints saves one). A new trial
starts while fewer than ``parallel`` run (``sweep_policy.next_indices``);
``sweep_policy.verdict`` says when the sweep finished (every trial ended, more failures
than ``maxFailedTrials``, ``maxDurationSeconds`` passed: the trials still running are
then canceled). With ``registerBest``, the best completed trial's outputs are published
to the local registry as a local run's ``outputs.register`` is
(``local.finalize.publish``). Called by the SDK's ``local_runs.sweep``; tested in
tests/unit/local/test_sweeps.py and tests/e2e/.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, TypedDict

from torchyard import api, records
from torchyard.api.sweeps import CANCELED_REASON
from torchyard.api.trainingruns import ModelOutput
from torchyard.launch.contract import NOT_METRICS, rank0_records
from torchyard.local import inputs as local_inputs
from torchyard.local.finalize import publish, record_model
from torchyard.local.results import LocalResult
from torchyard.local.runs import (
    LocalRun,
    default_registry,
    default_workroot,
    interruption,
    stopped_by_signals,
)
from torchyard.planning import sweeps as sweep_manifests
from torchyard.records import build
from torchyard.registry import Store, Version
from torchyard.status import sweeps as sweep_status
from torchyard.status.sweeps import Verdict
from torchyard.sweeps import policies, sampling, trials
from torchyard.sweeps.policies import IntervalPolicy
from torchyard.tuning import plans, sweep_policy, sweep_trials
from torchyard.tuning.sweep_trials import Entry, Seen

INTERRUPTED = "Interrupted"  # the verdict's reason when Ctrl-C (SIGTERM, SIGHUP) stopped it
POLL_SECONDS = 0.2  # how often the trials' metrics are read and the policy judges


class Trial:
    """One trial in this process: its TrainingRun, the :class:`LocalRun` that runs it in a
    thread, and what it reported so far."""

    def __init__(self, index: int, run: api.TrainingRun, local: LocalRun) -> None:
        self.index = index
        self.run = run
        self.local = local
        self.result: LocalResult | None = None
        self.error = ""
        self.decision: sweep_manifests.Decision | None = None
        self.started = time.monotonic()
        self.ended_at: float | None = None
        self._read = 0  # bytes of metrics.jsonl read
        self.metric_names: set[str] = set()  # the metrics its reports held
        self._thread = threading.Thread(target=self._execute, daemon=True)
        self._thread.start()

    def _execute(self) -> None:
        try:
            self.result = self.local.execute()
        except (OSError, ValueError) as err:  # it could not start
            self.error = str(err)
        self.ended_at = time.monotonic()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, decision: sweep_manifests.Decision) -> None:
        """Ask its nodes to stop (SIGTERM, their grace period), recording why."""
        self.decision = decision
        self.local._stop_all()

    def join(self) -> None:
        self._thread.join()

    def reports(self, metric: str) -> list[tuple[int, float | None]]:
        """The (step, metric) reports of rank 0 since the last call."""
        path = self.local.node_dir(0) / "logs" / "metrics.jsonl"
        try:
            with path.open("rb") as f:
                f.seek(self._read)
                chunk = f.read()
        except OSError:
            return []
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._read += len(complete)
        out: list[tuple[int, float | None]] = []
        for record in rank0_records(complete.decode("utf-8", "replace")):
            step = record.get("step")
            if not isinstance(step, int) or step < 1:
                continue
            self.metric_names |= set(record) - NOT_METRICS
            if metric in record:
                value = record[metric]
                number = isinstance(value, int | float) and not isinstance(value, bool)
                out.append((step, float(value) if number else None))
        return out

    def seen(self, entry: Entry, running: bool) -> Seen:
        """What it shows, as the controller reads a trial TrainingRun (``running``: whether
        it ran when its reports were last read, so that an ended trial's last reports are
        always in ``entry``)."""
        phase = "Running"
        failure = self.error
        if not running:
            ok = self.result is not None and self.result.exit_code == 0 and not self.error
            phase = "Suspended" if self.decision else "Succeeded" if ok else "Failed"
            if self.result is not None and self.result.failure and not failure:
                failure = str(self.result.failure.get("message") or "")
        end = self.ended_at or time.monotonic()
        last = entry.history[-1] if entry.history else None
        return Seen(
            index=self.index,
            name=self.run.name,
            phase=phase,
            parameters=dict(entry.parameters),
            decision=self.decision,
            started=True,
            seconds=(end - self.started) * _units(self.run),
            step=last[0] if last else None,
            value=last[1] if last else None,
            metrics=tuple(sorted(self.metric_names)),
            failure=failure,
        )


def _units(run: api.TrainingRun) -> int:
    nodes = run.spec.distribution.node_count
    gpus = run.spec.resources.gpus_per_node
    return nodes * gpus if gpus else nodes


@dataclass
class SweepResult:
    """What a local sweep did: how it finished, its book of trials, each trial's folder,
    and the model ``registerBest`` published."""

    sweep: api.Sweep
    verdict: Verdict
    book: trials.Book
    seed: int
    folders: dict[int, Path] = field(default_factory=dict)
    model: Version | None = None
    seconds: float = 0.0

    @property
    def succeeded(self) -> bool:
        return self.verdict.succeeded


class LocalSweep:
    """One local execution of a Sweep (see the module docstring)."""

    def __init__(
        self,
        sweep: api.Sweep,
        parameters: Any,
        make_run: Callable[[api.TrainingRun], LocalRun],
        *,
        parallel: int,
        store: Store,
        environment: api.Environment | None,
        say: Callable[[str], None],
        stop: threading.Event | None = None,
    ) -> None:
        self.sweep = sweep
        self.stop = stop or threading.Event()  # set: cancel the sweep (the SDK's cancel())
        self.compiled = plans.compile_spec(sweep, parameters)
        if isinstance(self.compiled.policy, policies.PausingPolicy):
            others = [p.TYPE for p in policies.registered() if issubclass(p, IntervalPolicy)]
            raise plans.Invalid(
                f"spec.earlyTermination.type: {self.compiled.policy.TYPE} pauses trials and "
                "resumes them later, which local mode does not do: use "
                f"{', '.join(others[:-1])} or {others[-1]} here, or run the Sweep in a cluster"
            )
        self.make_run = make_run
        self.parallel = parallel
        self.store = store
        self.environment = environment
        self.say = say
        self.trials: dict[int, Trial] = {}
        self.entries: dict[int, Entry] = {}
        self.started = time.monotonic()
        self.started_at = build.timestamp(datetime.now(timezone.utc))
        self.uid = str(sweep.metadata.get("uid") or uuid.uuid4())
        # the spec as written (an integer parameter stays an integer)
        self.body_spec: dict[str, Any] = {
            **sweep.spec.model_dump(mode="json", by_alias=True, exclude_none=True),
            "parameters": parameters,
        }
        self.pins: dict[str, str] | None = None  # taken for the first trial

    def _pinned(self) -> api.Sweep:
        """The sweep whose trials fetch, each, the version of a model:// input that names
        none that the registry's latest was when the first trial started (a version
        published by a trial meanwhile does not split the sweep), as in the cluster."""
        if self.pins is None:
            trial = self.sweep.spec.trial
            self.pins = local_inputs.latest(self.store, self.sweep.namespace, trial.inputs)
            for name, version in sorted(self.pins.items()):
                self.say(f"input {name}: every trial starts from version {version}")
        return sweep_manifests.pinned(self.sweep, self.pins)

    def _book(self) -> tuple[trials.Book, dict[int, Seen]]:
        metric = self.sweep.spec.objective.metric
        running = {i: t.running for i, t in self.trials.items()}  # before their reports
        for index, trial in self.trials.items():
            for step, value in trial.reports(metric):
                probe = replace(trial.seen(self.entries[index], True), step=step, value=value)
                self.entries[index] = sweep_trials.observed(self.entries[index], probe)
        seen = {i: t.seen(self.entries[i], running[i]) for i, t in self.trials.items()}
        book = sweep_trials.book(self.compiled.goal, self.entries, seen)
        return book, seen

    def _start(self, index: int, book: trials.Book) -> trials.Book:
        params = plans.parameters(self.compiled, index, book)
        manifest = sweep_manifests.trial(
            self._pinned(),
            index,
            params,
            sampling.arguments(params),
            sampling.environment(params),
        )
        run = api.parse_trainingrun(manifest)
        self.entries[index] = Entry(params)
        self.say(f"trial {run.name} starts with {sweep_trials.shown(params)}")
        self.trials[index] = Trial(index, run, self.make_run(run))
        return trials.fold(book, trials.Created(index, params))

    def _step(self) -> Verdict | None:
        """Read, judge, stop, decide, start: one pass (the controller's reconcile)."""
        if self.stop.is_set():
            return Verdict(False, CANCELED_REASON, "canceled: its running trials were canceled")
        book, seen = self._book()
        judged = sweep_policy.judge(self.compiled.policy, self.compiled.goal, self.entries, book)
        for index, interval in (judged.evaluated or {}).items():
            self.entries[index] = replace(self.entries[index], evaluated=interval)
        for decision in judged.stops:
            self.say(f"trial {self.trials[decision.trial].run.name} stopped: {decision.reason}")
            self.trials[decision.trial].stop(sweep_manifests.Decision("stopped", decision.reason))
            book = trials.fold(book, trials.decided(book, decision))
        elapsed = time.monotonic() - self.started
        verdict = sweep_policy.verdict(
            self.sweep.name,
            self.sweep.spec,
            book,
            len(self.trials),
            self.compiled.planned,
            elapsed,
            seen,
        )
        if verdict is not None:
            return verdict
        occupied = sum(1 for t in self.trials.values() if t.running)
        for index in sweep_policy.next_indices(
            len(self.trials), self.compiled.planned, occupied, self.parallel
        ):
            book = self._start(index, book)
        return None

    def _cancel_running(self, reason: str) -> None:
        for trial in self.trials.values():
            if trial.running and trial.decision is None:
                self.say(f"trial {trial.run.name} canceled: {reason}")
                trial.stop(sweep_manifests.Decision("canceled", reason))
        for trial in self.trials.values():
            trial.join()

    def execute(self) -> SweepResult:
        """Run the trials to the sweep's verdict; then register the best (``registerBest``)
        and record the sweep. Interrupted, it cancels its trials, records itself Failed
        (reason Interrupted) and raises the KeyboardInterrupt again."""
        spec = self.sweep.spec
        self.say(
            f"Sweep {self.sweep.name}: {self.compiled.planned} trial(s), {self.parallel} at a "
            f"time, {spec.sampling} sampling (seed {self.compiled.seed}), "
            f"{spec.objective.goal} {spec.objective.metric}, on this machine"
        )
        # SIGTERM and SIGHUP stop it as Ctrl-C does: the trials' nodes run in sessions of
        # their own, and would go on training without the CLI
        with stopped_by_signals():
            try:
                verdict = self._step()
                while verdict is None:
                    time.sleep(POLL_SECONDS)
                    verdict = self._step()
            except KeyboardInterrupt as err:
                self.say(f"{interruption(err)}: stopping every trial")
                self._cancel_running("the sweep was interrupted")
                book, _ = self._book()
                stopped = Verdict(False, INTERRUPTED, f"{interruption(err)}: every trial stopped")
                self._record(SweepResult(self.sweep, stopped, book, self.compiled.seed))
                raise
        self._cancel_running(f"the sweep finished ({verdict.reason}) before this trial ended")
        book, _ = self._book()
        result = SweepResult(self.sweep, verdict, book, self.compiled.seed)
        for index, trial in self.trials.items():
            if trial.result is not None:
                result.folders[index] = trial.result.workdir
        if spec.register_best is not None and verdict.succeeded:
            result.model = self._register(book, spec.register_best, result.folders)
        result.seconds = time.monotonic() - self.started
        self._record(result)
        return result

    def _status(self, result: SweepResult) -> dict[str, Any]:
        """The status a cluster's Sweep would end with (``status.sweeps``), every trial in
        its summary (the trials' ledger stays in this process)."""
        book = result.book
        best = trials.best(book)
        said = sweep_policy.metric_said(self.sweep.spec.objective.metric, self.sweep.name, book)
        saved = trials.seconds_saved(book)
        observed = sweep_status.Observed(
            seed=self.compiled.seed,
            metric=self.sweep.spec.objective.metric,
            planned=self.compiled.planned,
            created=len(book.trials),
            counts=trials.counts(book),
            trials_config_map="",
            best=sweep_trials.status_row(self.sweep.name, best) if best is not None else None,
            summary=[sweep_trials.status_row(self.sweep.name, r) for r in book.trials],
            seconds_spent=round(trials.seconds_spent(book), 1),
            seconds_saved=round(saved, 1) if saved is not None else None,
            metric_reported=said,
            verdict=result.verdict,
            hints=self.compiled.hints,
        )
        now = datetime.now(timezone.utc)
        status = sweep_status.sweep_status(None, observed, {"startTime": self.started_at}, now)
        status.pop("trialsConfigMap", None)
        if result.model is not None:
            status["model"] = {"name": result.model.model, "version": result.model.version}
        return status

    def _record(self, result: SweepResult) -> None:
        """The sweep's record in the local registry (``torchyard sweep get --local``)."""
        body = {
            "kind": "Sweep",
            "metadata": {
                **self.sweep.metadata,
                "namespace": self.sweep.namespace,
                "uid": self.uid,
                "creationTimestamp": self.started_at,
            },
            "spec": self.body_spec,
            "status": self._status(result),
        }
        try:
            made = records.sweep_record(body, [], datetime.now(timezone.utc))
            folder = records.FolderRecords(self.store.root).write(made)
        except (OSError, ValueError) as err:
            self.say(f"the sweep's record was not written: {err}")
            return
        self.say(f"recorded the sweep in {folder}")

    def _register(
        self, book: trials.Book, reg: ModelOutput, folders: Mapping[int, Path]
    ) -> Version | None:
        best = trials.best_completed(book)
        if best is None or best.index not in folders:
            self.say("registerBest: no trial completed with the metric: nothing to register")
            return None
        trial = self.trials[best.index]
        model = publish(
            trial.run, self.environment, self.store, folders[best.index] / "node-0", reg, self.say
        )
        record_model(self.store.root, trial.run, trial.local.uid, model)
        return model


class SweepOptions(TypedDict, total=False):
    """How :func:`run_sweep` runs a sweep (its keyword arguments), for what passes them on."""

    parallel: int
    registry: Path | None
    workroot: Path | None
    environment: api.Environment | None
    out: IO[str] | None
    grace_seconds: int
    stop: threading.Event | None


def run_sweep(
    sweep: api.Sweep,
    parameters: Any,
    source: Path,
    files: Sequence[str],
    *,
    parallel: int = 1,
    registry: Path | None = None,
    workroot: Path | None = None,
    environment: api.Environment | None = None,
    out: IO[str] | None = None,
    grace_seconds: int = 10,
    stop: threading.Event | None = None,
) -> SweepResult:
    """Run ``sweep`` on this machine, ``parallel`` trials at a time, each with ``files``
    of ``source`` in every node's folder. ``parameters``: the Sweep's own
    ``spec.parameters`` (an integer stays an integer); ``registry``, ``workroot``,
    ``environment``, ``out`` and ``grace_seconds`` as :func:`local.runs.run_local`;
    ``stop``: once set, the sweep is canceled (Failed, reason Canceled).
    :class:`torchyard.tuning.plans.Invalid` names what the sweeps core refuses."""
    stream = out or sys.stderr
    store_root = registry or default_registry()

    def make_run(run: api.TrainingRun) -> LocalRun:
        return LocalRun(
            run,
            source,
            files,
            environment,
            store_root=store_root,
            workroot=workroot or default_workroot(),
            out=stream,
            grace=grace_seconds,
            label=run.name if parallel > 1 else "",  # whose line it is, when trials interleave
        )

    def say(text: str) -> None:
        stream.write(f"[torchyard] {text}\n")
        stream.flush()

    return LocalSweep(
        sweep,
        parameters,
        make_run,
        parallel=parallel,
        store=Store(store_root.expanduser().resolve()),
        environment=environment,
        say=say,
        stop=stop,
    ).execute()


__all__ = ["LocalSweep", "SweepOptions", "SweepResult", "run_sweep"]
