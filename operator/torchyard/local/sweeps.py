"""A Sweep on this machine (``torchyard sweep submit FILE --local``): its trials run
``parallel`` at a time through the local runner (``local.runs``), with the plan, the
sampling, the early-termination decisions and the verdict of a cluster's Sweep
(``torchyard.tuning``, the controller's own modules).

Trial n is the TrainingRun ``<sweep>-t<n>`` the controller would make
(``planning.sweeps.trial``: the parameters as arguments and variables), run by a
:class:`LocalRun` in a thread of its own. While it runs, node 0's ``logs/metrics.jsonl``
(every progress report of its ranks; rank 0's are read) gives the objective's metric at
each step, added to the trial's ledger entry as the controller adds what it sees
(``sweep_trials.observed``); the book of trials is folded from the entries and what each
trial shows (``sweep_trials.book``), the policy judges it (``sweep_policy.judge``), and a
trial it stops is stopped as in a cluster: its nodes are asked to stop with their grace
period (one with checkpoints saves one). A new trial starts while fewer than ``parallel``
run (``sweep_policy.next_indices``); ``sweep_policy.verdict`` says when the sweep
finished (every trial ended, more failures than ``maxFailedTrials``,
``maxDurationSeconds`` passed: the trials still running are then canceled). With
``registerBest``, the best completed trial's outputs are published to the local registry
as a local run's ``outputs.register`` is (``local.finalize.publish``). Called by the
SDK's ``local_runs.sweep``; tested in tests/unit/test_local_sweeps.py and tests/e2e/.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from torchyard import api
from torchyard.api.trainingruns import ModelOutput
from torchyard.local import inputs as local_inputs
from torchyard.local.finalize import publish
from torchyard.local.results import LocalResult
from torchyard.local.runs import (
    LocalRun,
    default_registry,
    default_workroot,
    interruption,
    stopped_by_signals,
)
from torchyard.planning import sweeps as plans
from torchyard.registry import Store, Version
from torchyard.status.sweeps import Verdict
from torchyard.sweeps import sampling, trials
from torchyard.sweeps.stopping import Asha
from torchyard.tuning import plans as tuning
from torchyard.tuning import sweep_policy, sweep_trials
from torchyard.tuning.sweep_trials import Entry, Seen

POLL_SECONDS = 0.2  # how often the trials' metrics are read and the policy judges
# The keys of a progress record that are not metrics (progress.line, ProgressTracker).
NOT_METRICS = frozenset({"step", "total", "phase", "rank", "time"})


class Trial:
    """One trial in this process: its TrainingRun, the :class:`LocalRun` that runs it in a
    thread, and what it reported so far."""

    def __init__(self, index: int, run: api.TrainingRun, local: LocalRun) -> None:
        self.index = index
        self.run = run
        self.local = local
        self.result: LocalResult | None = None
        self.error = ""
        self.decision: plans.Decision | None = None
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

    def stop(self, decision: plans.Decision) -> None:
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
        for line in complete.decode("utf-8", "replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            step, value = record.get("step"), record.get(metric)
            if record.get("rank") not in (0, None) or not isinstance(step, int) or step < 1:
                continue
            self.metric_names |= set(record) - NOT_METRICS
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if metric in record:
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
    ) -> None:
        self.sweep = sweep
        self.compiled = tuning.compile_spec(sweep, parameters)
        if isinstance(self.compiled.policy, Asha):
            raise tuning.Invalid(
                "spec.earlyTermination.type: asha pauses trials and resumes them later, "
                "which local mode does not do: use bandit, median or truncation here, or "
                "run the Sweep in a cluster"
            )
        self.make_run = make_run
        self.parallel = parallel
        self.store = store
        self.environment = environment
        self.say = say
        self.trials: dict[int, Trial] = {}
        self.entries: dict[int, Entry] = {}
        self.started = time.monotonic()
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
        return plans.pinned(self.sweep, self.pins)

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
        params = tuning.parameters(self.compiled, index, book)
        manifest = plans.trial(
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
        book, seen = self._book()
        judged = sweep_policy.judge(self.compiled.policy, self.compiled.goal, self.entries, book)
        for index, interval in (judged.evaluated or {}).items():
            self.entries[index] = replace(self.entries[index], evaluated=interval)
        for decision in judged.stops:
            self.say(f"trial {self.trials[decision.trial].run.name} stopped: {decision.reason}")
            self.trials[decision.trial].stop(plans.Decision("stopped", decision.reason))
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
                trial.stop(plans.Decision("canceled", reason))
        for trial in self.trials.values():
            trial.join()

    def execute(self) -> SweepResult:
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
        return result

    def _register(
        self, book: trials.Book, reg: ModelOutput, folders: Mapping[int, Path]
    ) -> Version | None:
        best = trials.best_completed(book)
        if best is None or best.index not in folders:
            self.say("registerBest: no trial completed with the metric: nothing to register")
            return None
        trial = self.trials[best.index]
        return publish(
            trial.run, self.environment, self.store, folders[best.index] / "node-0", reg, self.say
        )


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
) -> SweepResult:
    """Run ``sweep`` on this machine, ``parallel`` trials at a time, each with ``files``
    of ``source`` in every node's folder. ``parameters``: the Sweep's own
    ``spec.parameters`` (an integer stays an integer); ``registry``, ``workroot``,
    ``environment``, ``out`` and ``grace_seconds`` as :func:`local.runs.run_local`.
    :class:`tuning.plans.Invalid` names what the sweeps core refuses."""
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
    ).execute()


__all__ = ["LocalSweep", "SweepResult", "run_sweep"]
