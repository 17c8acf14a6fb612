"""The Sweep reconcile, as one story: compile, observe, decide, apply, write once.

:func:`reconcile` reads top to bottom:

1. **parse** the spec and **compile** it with the sweeps core (the search space, the
   sampling and how many trials it makes, the policy, the goal, the seed): what the
   apiserver let through but the core refuses (a loguniform bound that overflows, names
   that differ only in case, a grid larger than ``maxTotalTrials``) makes the Sweep
   ``Failed`` with ``Accepted`` False, reason ``InvalidSpec``, the field named; said once,
   never retried, taken up again when the spec changes;
2. a **finished** sweep stays as it is;
3. **observe** its trials (the TrainingRuns labelled ``torchyard.dev/sweep=<sweep>`` that
   it owns) and its ledger (the ConfigMap ``<sweep>-trials``, ``sweep_trials``), adding
   the metric each trial shows now to its ledger entry, and fold both into the book of
   trials (``sweeps.trials``), from scratch: an operator that restarts sees the same;
4. **decide** (``sweep_policy``): the trials the early-termination policy stops, whether
   the sweep finished (its trials still running are then canceled), the new trials;
5. **apply**: each decision onto its trial (``spec.suspend`` and the decision's
   annotations: ``planning.sweeps.decided``), each new trial ``<sweep>-t<index>`` with
   the parameters sampled from (seed, index), so a restart makes neither a second trial
   nor other parameters (server-side apply), and the ledger when it changed; a model://
   input of the trial template that names no version is pinned once, for the first
   trial, to the model's latest version, kept in ``status.inputs`` (``_pin_models``), so
   a version registered while the sweep runs does not split its trials;
6. **write** the status (``status.sweeps``) and its Events once, at the end; once the
   sweep succeeded with ``spec.registerBest``, its best completed trial is registered
   first (``sweep_register``), and a finished sweep whose registration waits for the
   registry comes back for that alone.

Trial TrainingRuns' events queue their Sweep (``handlers``). Called by the work queue's
workers; tested against an in-memory fake of ``torchyard.k8s`` in
tests/unit/controller/test_sweeps.py and on a real control plane in
tests/integration/test_sweeps.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from torchyard import api, k8s
from torchyard.api import sweeps as sweep_api
from torchyard.controller import context, recording, sweep_register
from torchyard.controller import inputs as input_fetch
from torchyard.controller.context import Context, Event, Log, Outcome, Result
from torchyard.planning import inputs as input_plans
from torchyard.planning import names
from torchyard.planning import sweeps as sweep_manifests
from torchyard.status import sweeps as sweep_status
from torchyard.sweeps import sampling, stopping, trials
from torchyard.tuning import plans, sweep_policy, sweep_trials
from torchyard.tuning.plans import Compiled, Invalid, compile_spec
from torchyard.tuning.sweep_trials import Entry, Seen

# How soon a sweep whose trial names are still held by a deleted namesake's trials (being
# garbage collected) looks again.
NAMESAKE_RETRY_SECONDS = 2.0
# The ledger stays well within a ConfigMap's 1 MiB (histories are thinned to fit).
LEDGER_BUDGET = 800 * 1024
# Trials made by one reconcile at most (a sweep of thousands without maxConcurrentTrials
# makes them over several, each queued at once after the one before, so that a worker is
# not held for minutes and the status shows the trials as they come).
CREATES_PER_RECONCILE = 50


@dataclass
class Observed:
    """What one reconcile saw of a sweep's trials."""

    seen: dict[int, Seen]
    entries: dict[int, Entry]
    ledger: Mapping[str, str] | None  # the ledger's data, None when it is not there (or not ours)
    namesakes: set[str]  # trial names held by TrainingRuns another Sweep (of this name) owned
    # the versions its trials were made with, of the trial template's model:// inputs that
    # name none (by input name)
    versions: dict[str, str]

    @property
    def created(self) -> int:
        """Trials made so far: indices 0 .. created-1."""
        indices = set(self.seen) | set(self.entries)
        return max(indices) + 1 if indices else 0


def reconcile(body: Mapping[str, Any], logger: Log, ctx: Context) -> Result:
    """Reconcile one Sweep (see the module docstring)."""
    meta = body["metadata"]
    previous = dict(body.get("status") or {})
    now = ctx.clock()
    try:
        sweep = api.parse_sweep(dict(body))
        compiled = compile_spec(sweep, (body.get("spec") or {}).get("parameters"))
    except (api.InvalidSpec, Invalid) as err:
        logger.warning("Sweep %s/%s is invalid: %s", meta.get("namespace"), meta["name"], err)
        context.write(ctx, body, _invalid(meta.get("generation"), str(err), previous, now))
        return Result()
    if meta.get("deletionTimestamp"):
        return Result()  # owner references take the trials and the ledger away
    finished = previous.get("phase") in sweep_status.TERMINAL and previous.get("completionTime")
    if finished and not _registers(sweep, previous):
        return _finished(ctx, body, logger, now)

    seen = observe(ctx, sweep, compiled)
    book = sweep_trials.book(compiled.goal, seen.entries, seen.seen, _planned_intervals(seen))
    if finished:  # only its best trial's registration is left to do
        return _conclude(ctx, body, sweep, book, Outcome(previous, now, []), logger, Result())
    pins = _pin_models(ctx, sweep, previous, seen)
    sweep = sweep_manifests.pinned(sweep, {p["name"]: p["revision"] for p in pins})
    result = Result()
    events: list[Event] = []

    judged = sweep_policy.judge(compiled.policy, compiled.goal, seen.entries, book, compiled.seed)
    book = _apply_policy(ctx, sweep, book, [*judged.stops, *judged.pauses], events)
    elapsed = (now - sweep_trials.started_at(previous, now)).total_seconds()
    verdict = sweep_policy.verdict(
        sweep.name, sweep.spec, book, seen.created, compiled.planned, elapsed, seen.seen
    )
    cancels = _cancels(seen, book, verdict)
    for index, _ in cancels:
        book = trials.fold(book, trials.Ended(index, "canceled", _seconds(seen, index)))

    # apply: stop first (their room goes to the next gangs), then make the new trials
    for index, reason in cancels:
        _decide(ctx, sweep, index, sweep_manifests.Decision("canceled", reason))
    if cancels:
        shown = ", ".join(_trial(sweep, i) for i, _ in cancels)
        events.append(Event("Normal", "TrialsCanceled", f"{shown}: {cancels[0][1]}"))
    if verdict is None:
        try:
            book = _grow(ctx, sweep, compiled, seen, book, result, elapsed, events, logger)
        except Refused as refused:
            logger.warning("Sweep %s/%s: %s", sweep.namespace, sweep.name, refused)
            _write_ledger(ctx, sweep, seen, book, judged)
            context.write(ctx, body, _invalid(sweep.generation, str(refused), previous, now))
            return Result()
    _write_ledger(ctx, sweep, seen, book, judged)

    observed = replace(_status_inputs(sweep, compiled, seen, book, verdict), inputs=pins)
    new = sweep_status.sweep_status(sweep.generation, observed, previous, now)
    events = [*context.phase_events(previous, new), *events]
    if verdict is not None:
        log = logger.info if verdict.succeeded else logger.warning
        log("Sweep %s/%s %s: %s", sweep.namespace, sweep.name, new["phase"], verdict.message)
    result = _conclude(ctx, body, sweep, book, Outcome(new, now, events), logger, result)
    ended = new.get("phase") in sweep_status.TERMINAL
    if ended and ctx.settings.registry_url and result.requeue_after is None:
        result.requeue_after = 0.0  # its record is written by the next reconcile
    return result


def _grow(
    ctx: Context,
    sweep: api.Sweep,
    compiled: Compiled,
    seen: Observed,
    book: trials.Book,
    result: Result,
    elapsed: float,
    events: list[Event],
    logger: Log,
) -> trials.Book:
    """A sweep still going: ASHA's promotions first, then the new trials its free places
    take (:class:`Refused` when the apiserver refuses one), and when to look again."""
    occupied = sum(1 for s in seen.seen.values() if s.occupies)
    idle = occupied == 0  # no place held: what is not promoted now never will be
    book, promoted = _promote(ctx, sweep, compiled, seen, book, occupied, events)
    occupied += promoted
    wanted = sweep_policy.next_indices(
        seen.created, compiled.planned, occupied, sweep.spec.concurrency
    )
    if any(names.trial(sweep.name, i) in seen.namesakes for i in wanted):
        result.requeue_after = NAMESAKE_RETRY_SECONDS
        wanted = []
    if len(wanted) > CREATES_PER_RECONCILE:
        wanted = wanted[:CREATES_PER_RECONCILE]
        result.requeue_after = 0.0
    if idle and not promoted and not wanted:  # asha: the paused no promotion resumes
        unpromoted = sweep_policy.left_paused(book, seen.created, compiled.planned)
        book = _apply_policy(ctx, sweep, book, unpromoted, events)
        result.requeue_after = 0.0 if unpromoted else result.requeue_after
    book, held = _create(ctx, sweep, compiled, seen, book, wanted, logger)
    if held:  # a trial's name is held by a namesake's trial: look again
        later = result.requeue_after
        result.requeue_after = (
            min(later, NAMESAKE_RETRY_SECONDS) if later else NAMESAKE_RETRY_SECONDS
        )
    if sweep.spec.max_duration_seconds is not None:
        left = max(0.0, sweep.spec.max_duration_seconds - elapsed) + 0.5
        later = result.requeue_after
        result.requeue_after = left if later is None else min(later, left)
    return book


_APPLIED: dict[stopping.Action, tuple[sweep_manifests.What, str]] = {
    stopping.Action.STOP: ("stopped", "TrialStopped"),
    stopping.Action.PAUSE: ("paused", "TrialPaused"),
    stopping.Action.PROMOTE: ("promoted", "TrialPromoted"),
}


def _apply_policy(
    ctx: Context,
    sweep: api.Sweep,
    book: trials.Book,
    decisions: list[stopping.Decision],
    events: list[Event],
) -> trials.Book:
    """Each of the policy's decisions onto its trial (stopped or paused: suspended;
    promoted: resumed) and into the book, with its Event."""
    for decision in decisions:
        record = book.get(decision.trial)
        count = (record.promotions if record is not None else 0) + (
            decision.action is stopping.Action.PROMOTE
        )
        what, reason = _APPLIED[decision.action]
        _decide(ctx, sweep, decision.trial, sweep_manifests.Decision(what, decision.reason, count))
        book = trials.fold(book, trials.decided(book, decision))
        events.append(
            Event("Normal", reason, f"{_trial(sweep, decision.trial)}: {decision.reason}")
        )
    return book


def _promote(
    ctx: Context,
    sweep: api.Sweep,
    compiled: Compiled,
    seen: Observed,
    book: trials.Book,
    occupied: int,
    events: list[Event],
) -> tuple[trials.Book, int]:
    """ASHA's promotions into the free places (resumed before any new trial is made)."""
    free = sweep.spec.concurrency - occupied
    chosen = sweep_policy.promotions(
        compiled.policy, compiled.goal, seen.entries, book, compiled.seed, free
    )
    return _apply_policy(ctx, sweep, book, chosen, events), len(chosen)


def _registers(sweep: api.Sweep, status: Mapping[str, Any]) -> bool:
    return sweep.spec.register_best is not None and sweep_status.registration_pending(status)


def _conclude(
    ctx: Context,
    body: Mapping[str, Any],
    sweep: api.Sweep,
    book: trials.Book,
    outcome: Outcome,
    logger: Log,
    result: Result,
) -> Result:
    """Write the status, with the best trial registered first once the sweep succeeded
    (``spec.registerBest``, ``sweep_register``)."""
    if not _registers(sweep, outcome.status):
        context.write(ctx, body, outcome)
        return result
    done = sweep_register.register_best(ctx, sweep, book, logger)
    new = sweep_status.with_model(
        outcome.status, done.status, done.reason, done.message, outcome.at, done.model
    )
    events = list(outcome.events)
    if done.model is not None:
        events.append(Event("Normal", "ModelRegistered", done.message))
    elif not done.waiting:
        events.append(Event("Warning", "ModelNotRegistered", done.message))
    else:
        result.requeue_after = sweep_register.RETRY_SECONDS
    context.write(ctx, body, Outcome(new, outcome.at, events))
    return result


def _finished(ctx: Context, body: Mapping[str, Any], logger: Log, now: datetime) -> Result:
    """An ended Sweep: its record written once (``recording``), nothing else to do."""
    recorded = recording.finished_sweep(ctx, body, logger)
    if recorded.status is not None:
        context.write(ctx, body, Outcome(recorded.status, now, recorded.events))
    return Result(requeue_after=recorded.retry)


# -- observe ---------------------------------------------------------------------------


def observe(ctx: Context, sweep: api.Sweep, compiled: Compiled) -> Observed:
    """The sweep's trials and ledger, each trial's entry brought up to what it shows."""
    metric = sweep.spec.objective.metric
    loose = [i.name for i in input_plans.unversioned_of(sweep.spec.trial.inputs)]
    seen: dict[int, Seen] = {}
    namesakes: set[str] = set()
    versions: dict[str, str] = {}
    for run in ctx.k8s.list_(
        k8s.TRAININGRUNS, sweep.namespace, label_selector=sweep_manifests.selector(sweep.name)
    ):
        index = sweep_manifests.index_of(run)
        if not sweep_trials.owned(run, sweep.uid):
            namesakes.add(str(run["metadata"]["name"]))
        elif index is not None:
            seen[index] = sweep_trials.seen(run, index, metric)
            versions.update(sweep_manifests.trial_versions(run, loose))
    found = ctx.k8s.get_or_none(k8s.CONFIGMAPS, sweep.namespace, names.sweep_trials(sweep.name))
    ledger = (
        dict(found.get("data") or {}) if found and sweep_trials.owned(found, sweep.uid) else None
    )
    entries = sweep_trials.decode(ledger)
    for index, trial in seen.items():
        entry = entries.get(index) or Entry(trial.parameters or plans.parameters(compiled, index))
        entries[index] = sweep_trials.observed(entry, trial)
    return Observed(seen, entries, ledger, namesakes, versions)


def _pin_models(
    ctx: Context, sweep: api.Sweep, previous: Mapping[str, Any], seen: Observed
) -> list[dict[str, str]]:
    """The version each model:// input of the trial template that names none is pinned to,
    for every trial alike: the one the status keeps (or a trial was made with, when the
    operator stopped before writing it), else the model's latest ModelVersion now, taken
    once, for the first trial (a model with none is left unpinned: its trial fails naming
    it). As ``status.inputs`` lists them."""
    loose = input_plans.unversioned_of(sweep.spec.trial.inputs)
    if not loose:
        return []
    known = {**seen.versions, **input_plans.recorded_versions(previous)}
    return input_plans.pins(loose, input_fetch.latest_versions(ctx, sweep.namespace, loose, known))


def _planned_intervals(seen: Observed) -> int | None:
    totals = [s.total for s in seen.seen.values() if s.total]
    return max(totals) if totals else None


# -- decide and apply ------------------------------------------------------------------


def _trial(sweep: api.Sweep, index: int) -> str:
    return names.trial(sweep.name, index)


def _seconds(seen: Observed, index: int) -> float:
    trial = seen.seen.get(index)
    return trial.seconds if trial is not None else 0.0


def _cancels(
    seen: Observed, book: trials.Book, verdict: sweep_status.Verdict | None
) -> list[tuple[int, str]]:
    """Once the sweep finished: the trials not ended nor decided, canceled."""
    if verdict is None:
        return []
    reason = f"the sweep finished ({verdict.reason}) before this trial ended"
    out = []
    for index, trial in sorted(seen.seen.items()):
        record = book.get(index)
        held = trial.decision is not None and trial.decision.what in ("paused", "promoted")
        if trial.ended or (trial.decision is not None and not held):
            continue
        if record is not None and record.state in trials.ENDED:
            continue  # stopped by the policy in this reconcile
        out.append((index, reason))
    return out


def _decide(ctx: Context, sweep: api.Sweep, index: int, decision: sweep_manifests.Decision) -> None:
    ctx.k8s.apply(
        sweep_manifests.decided(sweep, index, decision),
        field_manager=sweep_manifests.DECISION_FIELD_MANAGER,
    )


class Refused(Exception):
    """The apiserver refused a trial TrainingRun: the message says which, and why."""


def _create(
    ctx: Context,
    sweep: api.Sweep,
    compiled: Compiled,
    seen: Observed,
    book: trials.Book,
    indices: list[int],
    logger: Log,
) -> tuple[trials.Book, bool]:
    """Make the trials ``indices`` in order (their entries and the book get them); a
    refusal that a retry cannot fix is :class:`Refused`. A trial that exists already
    (the view its reconcile read was older than the apiserver's) is read, never
    overwritten: this sweep's keeps its parameters; a namesake's (another Sweep of this
    name) stops the making, and says so (True)."""
    for index in indices:
        parameters = plans.parameters(compiled, index, book)
        manifest = sweep_manifests.trial(
            sweep,
            index,
            parameters,
            sampling.arguments(parameters),
            sampling.environment(parameters),
        )
        name = manifest["metadata"]["name"]
        found = _create_or_read(ctx, manifest)
        if found is not None:
            kept = sweep_trials.existing_parameters(found, sweep.uid, parameters)
            if kept is None:
                seen.namesakes.add(name)
                return book, True
            parameters = dict(kept)
        shown = sweep_trials.shown(parameters)
        said = "made" if found is None else "found made already"
        logger.info(
            "Sweep %s/%s: trial %s %s with %s", sweep.namespace, sweep.name, name, said, shown
        )
        seen.entries[index] = Entry(parameters)
        book = trials.fold(book, trials.Created(index, parameters))
    return book, False


def _create_or_read(ctx: Context, manifest: dict[str, Any]) -> dict[str, Any] | None:
    """Create the trial ``manifest``: None when made, else the TrainingRun of its name
    that exists (409 AlreadyExists: read, not overwritten)."""
    meta = manifest["metadata"]
    try:
        ctx.k8s.create(manifest, field_manager=k8s.FIELD_MANAGER)
        return None
    except k8s.ApiError as err:
        if err.status in (400, 422):
            raise Refused(
                f"spec.trial: the apiserver refused trial {meta['name']} "
                f"as a TrainingRun: {err.message}"
            ) from None
        if not err.conflict:
            raise
        found = ctx.k8s.get_or_none(k8s.TRAININGRUNS, meta["namespace"], meta["name"])
        if found is None:  # deleted since: the next reconcile makes it
            raise
        return found


def _write_ledger(
    ctx: Context,
    sweep: api.Sweep,
    seen: Observed,
    book: trials.Book,
    judged: sweep_policy.Judged,
) -> None:
    """Apply the ledger when what it would hold changed."""
    entries = dict(seen.entries)
    for index, interval in (judged.evaluated or {}).items():
        entries[index] = replace(entries[index], evaluated=interval)
    for index, recorded in (judged.rungs or {}).items():
        entries[index] = replace(entries[index], rungs=recorded)
    for record in book.trials:
        if record.index in entries:
            entries[record.index] = sweep_trials.now_entry(entries[record.index], record)
    data = sweep_trials.encode(entries, LEDGER_BUDGET)
    if data != seen.ledger:
        ctx.k8s.apply(sweep_manifests.ledger(sweep, data))


# -- status ----------------------------------------------------------------------------


def _status_inputs(
    sweep: api.Sweep,
    compiled: Compiled,
    seen: Observed,
    book: trials.Book,
    verdict: sweep_status.Verdict | None,
) -> sweep_status.Observed:
    metric = sweep.spec.objective.metric
    top = trials.ranked(book)[: sweep_api.STATUS_TOP]
    running = [r for r in book.trials if r.state is trials.TrialState.RUNNING and r not in top][
        : sweep_api.STATUS_RUNNING
    ]
    best = trials.best(book)
    said = sweep_policy.metric_said(metric, sweep.name, book)
    saved = trials.seconds_saved(book)
    return sweep_status.Observed(
        seed=compiled.seed,
        metric=metric,
        planned=compiled.planned,
        created=len(book.trials),
        counts=trials.counts(book),
        trials_config_map=names.sweep_trials(sweep.name),
        best=sweep_trials.status_row(sweep.name, best) if best is not None else None,
        summary=[sweep_trials.status_row(sweep.name, r) for r in [*top, *running]],
        seconds_spent=round(trials.seconds_spent(book), 1),
        seconds_saved=round(saved, 1) if saved is not None else None,
        failed_trials=[
            _trial(sweep, r.index) for r in book.trials if r.state is trials.TrialState.FAILED
        ],
        metric_reported=said,
        metric_missing=None if said else sweep_policy.metric_missing(metric, seen.seen),
        verdict=verdict,
        hints=compiled.hints,
        waiting=sweep_trials.waiting(seen.seen),
    )


def _invalid(
    generation: int | None, message: str, previous: Mapping[str, Any], now: datetime
) -> Outcome:
    new = sweep_status.invalid_sweep_status(generation, message, previous, now)
    return Outcome(new, now, context.phase_events(previous, new))
