"""What a Sweep does next, decided from its book of trials: which running trials the
early-termination policy stops, which new trials start, and whether the sweep finished.

- :func:`judge`: each running trial that reached a new evaluation interval since it was
  last judged is judged once, at the latest such interval, against every trial's metric
  over its first intervals (``sweeps.stopping.evaluate``: bandit, median, truncation). A
  trial is never judged twice at an interval, so an operator that restarts (the ledger
  keeps the interval each trial was judged at) makes the same decisions.
- :func:`next_indices`: the trials to make now, the next indices in order, while fewer
  than ``maxConcurrentTrials`` hold a place and fewer than the planned trials exist.
- :func:`verdict`: more failed trials than ``maxFailedTrials``, every planned trial
  ended, or ``maxDurationSeconds`` passed: the sweep finished, Succeeded with its best
  trial, or Failed saying why (too many failures, every trial failed, or no trial
  reported the metric), or Failed, reason Canceled, once spec.cancel is set; its trials
  still running are then canceled.
- :func:`metric_said`: the ``MetricReported`` condition's message either way;
  :func:`best_said`: how a verdict names the best trial (``trials.best``, its state when
  it did not complete).

Pure; called by ``controller.sweeps``; tested as tables in
tests/unit/controller/test_sweep_policy.py.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from torchyard.api import SweepSpec
from torchyard.api.sweeps import CANCELED_REASON
from torchyard.status.sweeps import Verdict
from torchyard.sweeps import trials
from torchyard.sweeps.policies import IntervalPolicy, PausingPolicy, Policy, Rungs
from torchyard.sweeps.stopping import Action, Decision, Goal, evaluate
from torchyard.sweeps.trials import TrialState
from torchyard.tuning.sweep_trials import Entry, Seen, dense

# Failed trials named in a verdict's message.
NAMED = 5


@dataclass(frozen=True)
class Judged:
    """The policy's stops and (ASHA) pauses, the interval each judged trial was looked at
    up to, and (ASHA) the rungs each trial is recorded at now."""

    stops: tuple[Decision, ...] = ()
    evaluated: Mapping[int, int] | None = None
    pauses: tuple[Decision, ...] = ()
    rungs: Mapping[int, tuple[tuple[int, float, float], ...]] | None = None


def _reached(
    entries: Mapping[int, Entry], book: trials.Book
) -> Iterator[tuple[trials.TrialRecord, Entry, int]]:
    """The running trials that reported a step since they were last judged, with their
    ledger entry and latest step."""
    for record in book.trials:
        entry = entries.get(record.index)
        if record.state is not TrialState.RUNNING or entry is None or not entry.history:
            continue
        if entry.last_step() > entry.evaluated:
            yield record, entry, entry.last_step()


def judge(
    policy: Policy | None,
    goal: Goal,
    entries: Mapping[int, Entry],
    book: trials.Book,
    seed: int = 0,
) -> Judged:
    """The running trials the policy stops (or pauses) now (see the module docstring)."""
    if policy is None:
        return Judged()
    if isinstance(policy, PausingPolicy):
        return judge_pausing(policy, goal, entries, book, seed)
    assert isinstance(policy, IntervalPolicy)
    histories = {i: dense(e.history, e.last_step()) for i, e in entries.items() if e.history}
    stops: list[Decision] = []
    evaluated: dict[int, int] = {}
    for record, entry, latest in _reached(entries, book):
        evaluated[record.index] = latest
        # the latest evaluation interval the trial reached since it was last judged
        at = latest - latest % policy.evaluation_interval
        if at <= entry.evaluated or not policy.applies_at(at):
            continue
        judged = {**histories, record.index: histories[record.index][:at]}
        decision = evaluate(policy, goal, judged, record.index)
        if decision.action is Action.STOP:
            stops.append(decision)
    return Judged(tuple(stops), evaluated)


def rungs_of(policy: PausingPolicy, seed: int, entries: Mapping[int, Entry]) -> Rungs:
    """A pausing policy's rungs from the ledger: every recording, in the order it was made."""
    state = policy.start()
    made = sorted((seq, i, m, score) for i, e in entries.items() for seq, m, score in e.rungs)
    brackets = [list(b) for b in state.brackets]
    for _, index, milestone, score in made:
        rungs = brackets[policy.bracket(seed, index)]
        for k, rung in enumerate(rungs):
            if rung.milestone == milestone and not rung.has(index):
                rungs[k] = replace(rung, recorded=(*rung.recorded, (index, score)))
    return Rungs(tuple(tuple(b) for b in brackets))


def judge_pausing(
    policy: PausingPolicy, goal: Goal, entries: Mapping[int, Entry], book: trials.Book, seed: int
) -> Judged:
    """Each running trial's new intervals reported to a pausing policy (asha) in order
    (its ``report``), up to the first pause: the trials it pauses (a trial at the end of
    its resource, asha's ``maxResource``, ends by itself) and the rungs recorded, numbered
    after the ledger's."""
    state = rungs_of(policy, seed, entries)
    seq = max((r[0] for e in entries.values() for r in e.rungs), default=-1) + 1
    pauses: list[Decision] = []
    stops: list[Decision] = []
    evaluated: dict[int, int] = {}
    rungs: dict[int, tuple[tuple[int, float, float], ...]] = {}
    for record, entry, latest in _reached(entries, book):
        evaluated[record.index] = latest
        bracket = policy.bracket(seed, record.index)
        values = dense(entry.history, latest)
        recorded = list(entry.rungs)
        for interval in range(entry.evaluated + 1, latest + 1):
            if policy.runs_to_end(interval):
                break  # it runs to its end by itself
            before = {r.milestone for r in state.brackets[bracket] if r.has(record.index)}
            state, decision = policy.report(
                goal, state, record.index, interval, values[interval - 1], bracket
            )
            for rung in state.brackets[bracket]:
                if rung.has(record.index) and rung.milestone not in before:
                    score = dict(rung.recorded)[record.index]
                    recorded.append((seq, rung.milestone, score))
                    seq += 1
            if decision.action is Action.PAUSE:
                pauses.append(decision)
                break
            if decision.action is Action.STOP:
                stops.append(decision)
                break
        rungs[record.index] = tuple(recorded)
    return Judged(tuple(stops), evaluated, tuple(pauses), rungs)


def promotions(
    policy: Policy | None,
    goal: Goal,
    entries: Mapping[int, Entry],
    book: trials.Book,
    seed: int,
    free: int,
) -> list[Decision]:
    """The paused trials a pausing policy (asha) promotes into ``free`` places now, best
    first."""
    if not isinstance(policy, PausingPolicy) or free <= 0:
        return []
    paused = {r.index for r in book.trials if r.state is TrialState.PAUSED}
    if not paused:
        return []
    return policy.promotions(goal, rungs_of(policy, seed, entries), paused)[:free]


def left_paused(book: trials.Book, created: int, planned: int) -> list[Decision]:
    """Once no trial runs or waits and none is left to make, the paused trials no
    promotion will resume: stopped, so that the sweep can finish."""
    states = {r.state for r in book.trials}
    if created < planned or states & {TrialState.RUNNING, TrialState.PENDING}:
        return []
    return [
        Decision(r.index, Action.STOP, "paused by asha, and no later trial did worse: stopped")
        for r in book.trials
        if r.state is TrialState.PAUSED
    ]


def next_indices(created: int, planned: int, occupied: int, concurrency: int) -> list[int]:
    """The indices of the trials to make now: ``created`` exist (0 .. created-1),
    ``occupied`` of them hold one of ``concurrency`` places."""
    free = max(0, concurrency - occupied)
    return list(range(created, min(planned, created + free)))


def _names(sweep: str, records: Sequence[trials.TrialRecord]) -> str:
    shown = ", ".join(f"{sweep}-t{r.index}" for r in records[:NAMED])
    return shown + (f" and {len(records) - NAMED} more" if len(records) > NAMED else "")


def verdict(
    sweep: str,
    spec: SweepSpec,
    book: trials.Book,
    created: int,
    planned: int,
    elapsed: float,
    seen: Mapping[int, Seen],
) -> Verdict | None:
    """Whether the sweep finished, and how (None: it goes on)."""
    metric = spec.objective.metric
    failed = [r for r in book.trials if r.state is TrialState.FAILED]
    if spec.cancel:
        best = trials.best(book)
        found = f"; the best so far is {best_said(sweep, metric, best)}" if best else ""
        return Verdict(
            False,
            CANCELED_REASON,
            f"canceled (spec.cancel); the trials still running were canceled{found}",
        )
    limit = spec.max_failed_trials
    if limit is not None and len(failed) > limit:
        return Verdict(
            False,
            "TooManyFailedTrials",
            f"{len(failed)} trial(s) failed ({_names(sweep, failed)}), more than "
            f"maxFailedTrials {limit}; the trials still running were canceled; "
            f"{sweep}-t{failed[0].index}: {failed[0].reason or 'see its status'}",
        )
    ended = all(r.state in trials.ENDED for r in book.trials)
    out_of_time = spec.max_duration_seconds is not None and elapsed >= spec.max_duration_seconds
    if not ((created >= planned and ended) or out_of_time):
        return None
    reason = "AllTrialsEnded" if created >= planned and ended else "MaxDurationReached"
    if book.trials and len(failed) == len(book.trials):
        first = failed[0]
        return Verdict(
            False,
            "AllTrialsFailed",
            f"every trial failed ({_names(sweep, failed)}); {sweep}-t{first.index}: "
            f"{first.reason or 'see its status'}",
        )
    best = trials.best(book)
    if best is None:
        return Verdict(False, "MetricMissing", metric_missing(metric, seen) or "")
    head = (
        f"all {len(book.trials)} trials ended"
        if reason == "AllTrialsEnded"
        else f"maxDurationSeconds {spec.max_duration_seconds} passed; the trials still "
        "running were canceled"
    )
    return Verdict(
        True,
        reason,
        f"{head}; the best is {best_said(sweep, metric, best)}{_registers(sweep, spec, book)}",
    )


def best_said(sweep: str, metric: str, best: trials.TrialRecord) -> str:
    """``<sweep>-t<n>, <metric> <value> at interval <i>``: the best value the trial
    reported and where; a best trial that ended without completing says its state
    (``t3 (Failed), ...``)."""
    state = f" ({best.state.value})" if best.state in trials.ENDED_INCOMPLETE else ""
    return (
        f"{sweep}-t{best.index}{state}, {metric} {best.best:.6g} at interval {best.best_interval}"
    )


def _registers(sweep: str, spec: SweepSpec, book: trials.Book) -> str:
    """What ``registerBest`` takes, said when it is not the best trial (which did not
    complete): the best completed trial, or none."""
    if spec.register_best is None:
        return ""
    best, done = trials.best(book), trials.best_completed(book)
    if done is not None and best is not None and done.index == best.index:
        return ""
    metric = spec.objective.metric
    if done is None:
        return f"; no trial completed with {metric}: registerBest registers nothing"
    return (
        f"; registerBest takes the best completed trial, {sweep}-t{done.index} ({metric} "
        f"{done.best:.6g})"
    )


def metric_said(metric: str, sweep: str, book: trials.Book) -> str | None:
    """MetricReported's message once a trial reported the metric (the first by index)."""
    reported = [r for r in book.trials if r.intervals > 0]
    if not reported:
        return None
    return f"{sweep}-t{reported[0].index} reported {metric} first"


def metric_missing(metric: str, seen: Mapping[int, Seen]) -> str | None:
    """Why no trial reports the metric, once a trial ended without it (None before)."""
    ended = [s for s in seen.values() if s.ended or s.decision is not None]
    if not ended:
        return None
    names = sorted({m for s in seen.values() for m in s.metrics})
    held = f"their progress holds {', '.join(names)}" if names else "they reported no metric"
    return (
        f"{len(ended)} trial(s) ended and none reported {metric} ({held}): a trial reports "
        f"it with torchyard.progress.report(epoch, {metric}=value), or progress.log"
        f"({metric!r}, value), and spec.objective.metric must name it exactly"
    )
