"""The book of trials: events fold into per-trial records; folding an event again changes
nothing (a restarted controller sees its events again); from the book come the best trial,
the counts, the trial-seconds spent and saved, and a summary whose size does not grow with
the number of trials."""

from __future__ import annotations

import itertools
import math

import pytest

from torchyard.sweeps import trials
from torchyard.sweeps.stopping import Action, Decision, Goal
from torchyard.sweeps.trials import (
    Book,
    Created,
    Decided,
    Ended,
    Reported,
    Started,
    TrialState,
)


def decided(trial: int, action: Action, reason: str = "policy", epoch: int | None = None):
    return Decided(Decision(trial, action, reason), epoch)


LIFE: list[trials.Event] = [
    Created(0, {"lr": 0.01, "momentum": 0.9}),
    Created(1, {"lr": 0.001, "momentum": 0.95}),
    Started(0),
    Started(1),
    Reported(0, 1, 0.30, 10.0),
    Reported(1, 1, 0.20, 12.0),
    Reported(0, 2, 0.50, 20.0),
    decided(1, Action.PAUSE, "below the cutoff", epoch=0),
    Reported(0, 3, 0.45, 30.0),
    decided(1, Action.PROMOTE, "now in the top third", epoch=0),
    Started(1),
    Reported(1, 2, 0.55, 24.0),
    Ended(0, "completed", 31.0),
    Reported(1, 3, math.nan, 36.0),
    decided(1, Action.STOP, "diverged", epoch=1),
]


def test_a_trials_life_folds_into_its_record() -> None:
    book = trials.fold_all(Book(Goal.MAXIMIZE, planned_intervals=3), LIFE)
    zero, one = book.trials
    assert zero == trials.TrialRecord(
        index=0,
        parameters=(("lr", 0.01), ("momentum", 0.9)),
        state=TrialState.COMPLETED,
        intervals=3,
        finite=3,
        last=0.45,
        best=0.50,
        best_interval=2,
        mean=pytest.approx((0.30 + 0.50 + 0.45) / 3),  # type: ignore[arg-type]
        seconds=31.0,
    )
    assert one.state is TrialState.STOPPED and one.reason == "diverged"
    assert (one.intervals, one.finite, one.best, one.promotions) == (3, 2, 0.55, 1)
    assert one.last is not None and math.isnan(one.last)
    assert one.params() == {"lr": 0.001, "momentum": 0.95}


def test_folding_every_event_twice_changes_nothing() -> None:
    once = trials.fold_all(Book(Goal.MAXIMIZE), LIFE)
    twice = trials.fold_all(Book(Goal.MAXIMIZE), [e for e in LIFE for _ in range(2)])
    assert twice == once


def test_a_restart_that_replays_its_events_ends_with_the_same_book() -> None:
    full = trials.fold_all(Book(Goal.MAXIMIZE), LIFE)
    for cut in range(len(LIFE)):
        before = trials.fold_all(Book(Goal.MAXIMIZE), LIFE[:cut])
        assert trials.fold_all(before, LIFE) == full  # everything seen again from the start


# (the trial's state, the event, the state after)
TRANSITIONS = [
    (TrialState.PENDING, Started(0), TrialState.RUNNING),
    (TrialState.PENDING, decided(0, Action.STOP), TrialState.STOPPED),
    (TrialState.PENDING, decided(0, Action.PAUSE), TrialState.PENDING),
    (TrialState.PENDING, Ended(0, "canceled", 0.0), TrialState.CANCELED),
    (TrialState.RUNNING, decided(0, Action.PAUSE), TrialState.PAUSED),
    (TrialState.RUNNING, decided(0, Action.STOP), TrialState.STOPPED),
    (TrialState.RUNNING, decided(0, Action.CONTINUE), TrialState.RUNNING),
    (TrialState.RUNNING, decided(0, Action.PROMOTE), TrialState.RUNNING),
    (TrialState.RUNNING, Started(0), TrialState.RUNNING),
    (TrialState.RUNNING, Ended(0, "failed", 5.0), TrialState.FAILED),
    (TrialState.PAUSED, decided(0, Action.PROMOTE), TrialState.PENDING),
    (TrialState.PAUSED, decided(0, Action.STOP), TrialState.STOPPED),
    (TrialState.PAUSED, Started(0), TrialState.PAUSED),
    (TrialState.STOPPED, Started(0), TrialState.STOPPED),
    (TrialState.STOPPED, Ended(0, "completed", 5.0), TrialState.STOPPED),
    (TrialState.COMPLETED, decided(0, Action.STOP), TrialState.COMPLETED),
    (TrialState.FAILED, decided(0, Action.PROMOTE), TrialState.FAILED),
]


@pytest.mark.parametrize(("state", "event", "after"), TRANSITIONS)
def test_each_event_moves_a_trial_only_where_it_applies(
    state: TrialState, event: trials.Event, after: TrialState
) -> None:
    book = Book(Goal.MAXIMIZE, trials=(trials.TrialRecord(0, (), state=state),))
    assert trials.fold(book, event).trials[0].state is after


def test_a_pause_decided_before_a_promotion_is_stale_after_it() -> None:
    book = trials.fold_all(Book(Goal.MAXIMIZE), [Created(0, {}), Started(0)])
    pause = trials.decided(book, Decision(0, Action.PAUSE, "below the cutoff"))
    book = trials.fold(book, pause)
    promote = trials.decided(book, Decision(0, Action.PROMOTE, "now in the top third"))
    book = trials.fold_all(book, [promote, Started(0)])
    assert (pause.epoch, promote.epoch) == (0, 0)
    assert trials.fold_all(book, [pause, promote]) == book  # seen again: nothing
    assert book.trials[0].state is TrialState.RUNNING and book.trials[0].promotions == 1


def test_a_report_from_a_trial_not_running_only_counts_its_seconds() -> None:
    book = trials.fold_all(
        Book(Goal.MAXIMIZE),
        [Created(0, {}), Started(0), Reported(0, 1, 0.5, 10.0), decided(0, Action.PAUSE)],
    )
    late = trials.fold(book, Reported(0, 2, 0.9, 14.0))  # sent before the pause took hold
    assert late.trials[0].best == 0.5 and late.trials[0].seconds == 14.0


def test_an_event_about_a_trial_never_created_is_an_error() -> None:
    with pytest.raises(ValueError, match="trial 3 was not created"):
        trials.fold(Book(Goal.MAXIMIZE), Started(3))


@pytest.mark.parametrize(
    ("goal", "best_trial", "best"), [(Goal.MAXIMIZE, 2, 0.9), (Goal.MINIMIZE, 0, 0.1)]
)
def test_the_best_trial_is_by_the_objective_whatever_its_state(
    goal: Goal, best_trial: int, best: float
) -> None:
    events: list[trials.Event] = []
    for trial, values in enumerate([[0.3, 0.1], [0.5, 0.4], [0.2, 0.9], [math.nan]]):
        events += [Created(trial, {"t": trial}), Started(trial)]
        events += [Reported(trial, i + 1, v, 1.0) for i, v in enumerate(values)]
    events.append(decided(2, Action.STOP))  # a stopped trial can be the best
    book = trials.fold_all(Book(goal), events)
    found = trials.best(book)
    assert found is not None and (found.index, found.best) == (best_trial, best)
    assert trials.ranked(book)[0].index == best_trial
    assert 3 not in [r.index for r in trials.ranked(book)]  # no finite metric: not ranked


def test_a_tie_goes_to_the_earlier_trial() -> None:
    events: list[trials.Event] = []
    for trial in (4, 2, 7):
        events += [Created(trial, {}), Started(trial), Reported(trial, 1, 0.8, 1.0)]
    found = trials.best(trials.fold_all(Book(Goal.MAXIMIZE), events))
    assert found is not None and found.index == 2


def test_no_metric_no_best() -> None:
    assert trials.best(trials.fold_all(Book(Goal.MAXIMIZE), [Created(0, {})])) is None


def test_seconds_spent_and_saved() -> None:
    events: list[trials.Event] = [Created(t, {}) for t in range(4)]
    events += [Started(t) for t in range(4)]
    events += [Reported(0, 81, 0.9, 162.0), Ended(0, "completed", 162.0)]
    events += [Reported(1, 10, 0.2, 20.0), decided(1, Action.STOP)]  # 2 s an interval
    events += [Reported(2, 27, 0.5, 81.0), decided(2, Action.PAUSE)]  # 3 s an interval
    events += [Reported(3, 5, 0.1, 5.0), Ended(3, "failed", 5.0)]  # a failure saves nothing
    book = trials.fold_all(Book(Goal.MAXIMIZE), events)
    assert trials.seconds_spent(book) == 162.0 + 20.0 + 81.0 + 5.0
    # planned length unknown: the longest completed trial's, 81 intervals
    assert trials.seconds_saved(book) == 2.0 * 71 + 3.0 * 54
    assert trials.seconds_saved(Book(Goal.MAXIMIZE, 100, book.trials)) == 2.0 * 90 + 3.0 * 73
    nothing_done = trials.fold_all(Book(Goal.MAXIMIZE), events[:8] + events[10:12])
    assert trials.seconds_saved(nothing_done) is None


def test_counts_name_every_state() -> None:
    book = trials.fold_all(Book(Goal.MAXIMIZE), LIFE)
    assert trials.counts(book) == {
        "Pending": 0,
        "Running": 0,
        "Paused": 0,
        "Stopped": 1,
        "Completed": 1,
        "Failed": 0,
        "Canceled": 0,
    }


def test_the_summary_stays_the_same_size_however_many_trials() -> None:
    sizes = []
    for count in (10, 1000):
        events: list[trials.Event] = []
        for trial in range(count):
            events += [Created(trial, {"lr": trial / count}), Started(trial)]
            events.append(Reported(trial, 1, trial / count, 1.0))
        summary = trials.summary(trials.fold_all(Book(Goal.MAXIMIZE), events), top=5)
        assert summary["trials"]["total"] == count and summary["trials"]["Running"] == count
        assert [row["trial"] for row in summary["top"]] == list(range(count - 1, count - 6, -1))
        assert summary["best"]["trial"] == count - 1
        assert summary["best"]["parameters"] == {"lr": (count - 1) / count}
        assert summary["trialSeconds"] == {"spent": float(count), "saved": None}
        sizes.append(len(repr({k: v for k, v in summary.items() if k != "trials"})))
    assert abs(sizes[0] - sizes[1]) < 100


def test_created_keeps_the_parameters_in_name_order() -> None:
    for order in itertools.permutations(["b", "a", "c"]):
        book = trials.fold(Book(Goal.MAXIMIZE), Created(0, {n: 1 for n in order}))
        assert [n for n, _ in book.trials[0].parameters] == ["a", "b", "c"]


def test_folding_all_at_once_is_folding_one_event_at_a_time() -> None:
    """``fold_all`` (a sweep's whole book, folded afresh each reconcile) keeps the trials
    by index whatever order they were created in, as ``fold`` does."""
    events: list[trials.Event] = [Created(5, {"lr": 0.5}), Started(5)]
    for e in LIFE:  # trial 0 and 1's lives, with trial 3's interleaved
        events.append(e)
        if isinstance(e, Created) and e.trial == 1:
            events += [Created(3, {"lr": 0.3}), Started(3), Reported(3, 1, 0.9, 4.0)]
    events += [Ended(3, "failed", 5.0, "rank 0 exited with 1"), decided(5, Action.STOP)]
    one_by_one = Book(Goal.MAXIMIZE, planned_intervals=3)
    for e in events:
        one_by_one = trials.fold(one_by_one, e)
    assert trials.fold_all(Book(Goal.MAXIMIZE, planned_intervals=3), events) == one_by_one
    assert [r.index for r in one_by_one.trials] == [0, 1, 3, 5]
