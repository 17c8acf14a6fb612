"""What a Sweep decides (``tuning.sweep_policy``) and how it reads its trials
(``tuning.sweep_trials``), as tables: one value per interval from the steps seen, a
trial judged once at its latest evaluation interval, the next trials to make, the verdict,
and the ledger read back as it was written."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from tests.builders import SweepBuilder
from torchyard import api
from torchyard.planning import sweeps as plans
from torchyard.sweeps import policies, stopping, trials
from torchyard.sweeps.stopping import Goal
from torchyard.tuning import sweep_policy, sweep_trials
from torchyard.tuning.sweep_trials import Entry, Seen

BANDIT = policies.Bandit(slack_factor=0.15, evaluation_interval=1, delay_evaluation=2)


@pytest.mark.parametrize(
    ("history", "upto", "dense"),
    [
        ([], 3, []),
        ([(1, 0.5), (2, 0.6), (3, 0.7)], 3, [0.5, 0.6, 0.7]),
        ([(1, 0.5), (3, 0.7)], 4, [0.5, 0.5, 0.7, 0.7]),  # a step missed: the one before
        ([(3, 0.7), (5, 0.8)], 5, [0.7, 0.7, 0.7, 0.7, 0.8]),  # before the first: the first
        ([(1, None), (2, 0.6)], 2, [None, 0.6]),
    ],
)
def test_dense_gives_one_value_per_interval(
    history: list[tuple[int, float | None]], upto: int, dense: list[float | None]
) -> None:
    assert sweep_trials.dense(history, upto) == dense


def running_book(entries: Mapping[int, Entry], goal: Goal = Goal.MAXIMIZE) -> trials.Book:
    seen = {i: seen_trial(i, "Running") for i in entries}
    return sweep_trials.book(goal, entries, seen)


def seen_trial(index: int, phase: str | None, **kw: object) -> Seen:
    return Seen(
        index=index,
        name=f"hd-t{index}",
        phase=phase,
        parameters={"lr": 0.1 * index},
        decision=kw.pop("decision", None),  # type: ignore[arg-type]
        started=phase is not None and phase != "Pending",
        seconds=60.0,
        **kw,  # type: ignore[arg-type]
    )


LEADER = Entry({"lr": 0.0}, ((1, 0.5), (2, 0.8), (3, 0.9)), evaluated=3)
CASES: list[tuple[str, Entry, list[int], int | None]] = [
    # (what, trial 1's entry, trials stopped, the interval trial 1 is judged up to)
    ("before the delay", Entry({"lr": 0.1}, ((1, 0.1),)), [], 1),
    ("below the slack at interval 2", Entry({"lr": 0.1}, ((1, 0.3), (2, 0.6))), [1], 2),
    ("within the slack", Entry({"lr": 0.1}, ((1, 0.3), (2, 0.7))), [], 2),
    ("judged at 2 already", Entry({"lr": 0.1}, ((1, 0.3), (2, 0.6)), evaluated=2), [], None),
    # interval 2 was missed by the reads: judged at 3, against the leader's 0.9 by 3
    ("a step missed", Entry({"lr": 0.1}, ((1, 0.3), (3, 0.75))), [1], 3),
]


@pytest.mark.parametrize(
    ("entry", "stopped", "evaluated"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bandit_judges_each_trial_once_at_its_latest_evaluation_interval(
    entry: Entry, stopped: list[int], evaluated: int | None
) -> None:
    entries = {0: LEADER, 1: entry}
    judged = sweep_policy.judge(BANDIT, Goal.MAXIMIZE, entries, running_book(entries))
    assert [d.trial for d in judged.stops] == stopped
    assert (judged.evaluated or {}).get(1) == evaluated
    for decision in judged.stops:
        assert decision.action is stopping.Action.STOP
        assert "trial 0" in decision.reason


def test_no_policy_judges_nothing() -> None:
    entries = {0: LEADER, 1: Entry({}, ((1, 0.0), (2, 0.0)))}
    assert sweep_policy.judge(None, Goal.MAXIMIZE, entries, running_book(entries)).stops == ()


@pytest.mark.parametrize(
    ("created", "planned", "occupied", "concurrency", "indices"),
    [
        (0, 8, 0, 4, [0, 1, 2, 3]),
        (4, 8, 4, 4, []),
        (4, 8, 3, 4, [4]),
        (7, 8, 0, 4, [7]),
        (8, 8, 0, 4, []),
        (2, 9, 5, 4, []),  # more occupied than allowed (maxConcurrentTrials lowered)
    ],
)
def test_next_indices(
    created: int, planned: int, occupied: int, concurrency: int, indices: list[int]
) -> None:
    assert sweep_policy.next_indices(created, planned, occupied, concurrency) == indices


SPEC = api.parse_sweep(SweepBuilder("hd").trials(3, 3).obj()).spec


def verdict_of(
    phases: dict[int, str], values: dict[int, float], spec: api.SweepSpec = SPEC, elapsed: float = 0
) -> tuple[str, str] | None:
    entries = {i: Entry({"lr": 0.1 * i}, ((1, values[i]),) if i in values else ()) for i in phases}
    ended = {
        i: seen_trial(i, p, failure="exit 1" if p == "Failed" else "") for i, p in phases.items()
    }
    book = sweep_trials.book(Goal.MAXIMIZE, entries, ended)
    found = sweep_policy.verdict("hd", spec, book, len(phases), 3, elapsed, ended)
    return None if found is None else ("Succeeded" if found.succeeded else "Failed", found.reason)


def test_the_verdicts() -> None:
    done = {0: "Succeeded", 1: "Succeeded", 2: "Failed"}
    assert verdict_of({0: "Running", 1: "Succeeded"}, {0: 0.5}) is None
    assert verdict_of(done, {0: 0.5, 1: 0.7}) == ("Succeeded", "AllTrialsEnded")
    assert verdict_of(done, {}) == ("Failed", "MetricMissing")
    failed = {0: "Failed", 1: "Failed", 2: "Failed"}
    assert verdict_of(failed, {0: 0.5}) == ("Failed", "AllTrialsFailed")
    limited = SPEC.model_copy(update={"max_failed_trials": 0})
    assert verdict_of({0: "Failed", 1: "Running"}, {}, limited) == (
        "Failed",
        "TooManyFailedTrials",
    )
    timed = SPEC.model_copy(update={"max_duration_seconds": 60})
    assert verdict_of({0: "Running", 1: "Running"}, {1: 0.4}, timed, elapsed=59) is None
    assert verdict_of({0: "Running", 1: "Running"}, {1: 0.4}, timed, elapsed=60) == (
        "Succeeded",
        "MaxDurationReached",
    )


def test_the_ledger_reads_back_what_it_wrote_and_skips_what_it_cannot_read() -> None:
    entries = {
        0: Entry({"lr": 0.001, "bs": 32, "opt": "sgd"}, ((1, 0.5), (2, None)), 2, "Running"),
        11: Entry({"lr": 0.01}, (), 0, "Stopped", "below the slack", 120.0),
        12: Entry({"lr": 0.1}, ((1, 0.2),), 1, "Paused", "asha", 5.0, ((3, 1.0, 0.2),)),
    }
    data = sweep_trials.encode(entries)
    assert sorted(data) == ["t0", "t11", "t12"]
    assert sweep_trials.decode(data) == entries
    assert sweep_trials.decode({**data, "t2": "{not json", "notes": "hello"}) == entries


def test_a_ledger_over_its_budget_thins_every_history_keeping_the_ends() -> None:
    history = tuple((step, step / 1000) for step in range(1, 401))
    entries = {i: Entry({"lr": 0.1}, history) for i in range(20)}
    data = sweep_trials.encode(entries, budget=40_000)
    assert sum(len(v) for v in data.values()) <= 40_000
    kept = sweep_trials.decode(data)[0].history
    assert kept[0] == history[0] and kept[-1] == history[-1] and len(kept) < 400


@pytest.mark.parametrize(
    ("status", "value", "step"),
    [
        ({"progress": {"step": 4, "metrics": {"best_val_acc": 0.8}}}, 0.8, 4),
        ({"progress": {"step": 4, "metrics": {"loss": 0.8}}}, None, None),
        ({"progress": {"step": 4}}, None, None),
        ({}, None, None),
    ],
)
def test_a_trial_shows_its_metric_at_its_step(
    status: dict[str, object], value: float | None, step: int | None
) -> None:
    run = {"metadata": {"name": "hd-t0"}, "spec": {}, "status": status}
    shown = sweep_trials.seen(run, 0, "best_val_acc")
    assert (shown.value, shown.step) == (value, step)


def ready(reason: str, message: str, status: str = "False") -> dict[str, str]:
    return {"type": "Ready", "status": status, "reason": reason, "message": message}


NO_ENV = "spec.environment: Environment nope does not exist in namespace team"


@pytest.mark.parametrize(
    ("status", "waiting"),
    [
        ({"phase": "Preparing", "conditions": [ready("EnvironmentNotFound", NO_ENV)]},
         ("EnvironmentNotFound", NO_ENV)),
        ({"phase": "Queued", "conditions": [ready("Queued", "waiting for 2 GPUs")]},
         ("Queued", "waiting for 2 GPUs")),
        ({"phase": "Running", "startTime": "2026-01-01T12:00:00Z",
          "conditions": [ready("AllNodesRunning", "2/2 node(s) running")]}, None),
        ({"phase": "Failed", "conditions": [ready("EnvironmentFailed", "the build failed")]},
         None),
        ({}, None),
    ],
)  # fmt: skip
def test_a_trial_that_has_not_started_shows_what_it_waits_for(
    status: dict[str, object], waiting: tuple[str, str] | None
) -> None:
    run = {"metadata": {"name": "hd-t0"}, "spec": {}, "status": status}
    assert sweep_trials.seen(run, 0, "m").waiting == waiting
    if waiting is not None:  # a change of what it waits for queues its Sweep
        other = {**run, "status": {**status, "conditions": [ready("Other", "x")]}}
        assert sweep_trials.sweep_reads(run) != sweep_trials.sweep_reads(other)


def test_the_sweep_says_why_its_trials_wait_naming_them_by_reason() -> None:
    def trial(index: int, waiting: tuple[str, str] | None, what: str | None = None) -> Seen:
        decision = None if what is None else plans.Decision(what, "")
        return Seen(index, f"hd-t{index}", "Preparing", {}, decision, False, 0.0, waiting=waiting)

    no_env = ("EnvironmentNotFound", NO_ENV)
    seen = {i: trial(i, no_env) for i in range(7)}
    seen[7] = trial(7, ("InputSecretNotReady", "input shots: the Secret s is missing"))
    seen[8] = trial(8, None)  # started
    seen[9] = trial(9, no_env, "stopped")  # the sweep stopped it: it waits for nothing
    assert sweep_trials.waiting(seen) == (
        "EnvironmentNotFound",
        "8 trial(s) cannot start yet; hd-t0, hd-t1, hd-t2, hd-t3, hd-t4 and 2 more: "
        f"EnvironmentNotFound: {NO_ENV}; hd-t7: InputSecretNotReady: input shots: the "
        "Secret s is missing",
    )
    assert sweep_trials.waiting({8: seen[8], 9: seen[9]}) is None


def test_trial_seconds_count_gpus_and_end_where_the_trial_stopped() -> None:
    spec = {"resources": {"gpusPerNode": 2}, "distribution": {"nodeCount": 2}}
    status = {
        "phase": "Suspended",
        "startTime": "2026-01-01T12:00:00Z",
        "suspendedSince": "2026-01-01T12:01:00Z",
    }
    run = {"metadata": {"name": "hd-t0"}, "spec": spec, "status": status}
    assert sweep_trials.seen(run, 0, "m").seconds == 60 * 4


@pytest.mark.parametrize(
    ("policy", "stopped"),
    [
        # running averages by interval 2: 0.55, 0.65, 0.25 -> median 0.55; trial 2's best 0.3
        (policies.Median(evaluation_interval=1, delay_evaluation=2), [2]),
        # of 3 trials, the lowest 34 % is 1 trial: trial 2
        (policies.Truncation(truncation_percentage=34, delay_evaluation=2), [2]),
        (policies.Truncation(truncation_percentage=20, delay_evaluation=2), []),
    ],
)
def test_median_and_truncation_judge_the_same_way(
    policy: stopping.IntervalPolicy, stopped: list[int]
) -> None:
    entries = {
        0: Entry({}, ((1, 0.5), (2, 0.6)), evaluated=2),
        1: Entry({}, ((1, 0.6), (2, 0.7)), evaluated=2),
        2: Entry({}, ((1, 0.2), (2, 0.3))),
    }
    judged = sweep_policy.judge(policy, Goal.MAXIMIZE, entries, running_book(entries))
    assert [d.trial for d in judged.stops] == stopped


def made_trial(owner: str, annotation: str | None) -> dict[str, object]:
    meta: dict[str, object] = {
        "name": "hd-t4",
        "ownerReferences": [{"kind": "Sweep", "uid": owner}],
    }
    if annotation is not None:
        meta["annotations"] = {"torchyard.dev/parameters": annotation}
    return {"metadata": meta}


@pytest.mark.parametrize(
    ("owner", "annotation", "kept"),
    [
        ("uid-hd", '{"lr": 0.003}', {"lr": 0.003}),  # ours: the parameters it was made with
        ("uid-hd", None, {"lr": 0.1}),  # ours, unreadable: the ones it would be made with
        ("uid-hd", "not json", {"lr": 0.1}),
        ("uid-hd", "[0.003]", {"lr": 0.1}),
        ("uid-old", '{"lr": 0.003}', None),  # a namesake's (another Sweep of this name)
    ],
)
def test_a_trial_found_made_at_create_keeps_its_own_parameters_when_ours(
    owner: str, annotation: str | None, kept: dict[str, float] | None
) -> None:
    found = made_trial(owner, annotation)
    assert sweep_trials.existing_parameters(found, "uid-hd", {"lr": 0.1}) == kept
    assert sweep_trials.owned(found, "uid-hd") is (owner == "uid-hd")
    assert sweep_trials.owned({"metadata": {}}, "uid-hd") is False
