"""Early termination on a synthetic sweep: the trial-seconds each policy uses and the best
metric it finds, against the same sweep run to the end (the baseline, whose best is the
exhaustive best).

No training: each trial's validation accuracy per epoch comes from a shipped learning-curve
family, ``acc(t) = a - (a - 0.1) * exp(-c * t) + noise``, where the effective learning rate
``lr / (1 - momentum)`` sets both the asymptote ``a`` (highest at 0.05, lower on either side)
and the speed ``c`` (a larger rate learns faster early, so a fast starter is not always the
best finisher), and the noise (sd 0.004) comes from a generator seeded by (seed, trial).
The space is the guide's notebook's: ``learning_rate`` uniform(0.0005, 0.005), ``momentum``
uniform(0.9, 0.99), drawn by ``torchyard.sweeps.sampling`` (seeded random sampling).

A simulated asynchronous scheduler runs ``--trials`` trials ``--slots`` at a time, each
epoch taking the trial's own duration (0.8 to 1.2 s, fixed per trial): when a trial reports
an epoch the policy decides (``torchyard.sweeps.stopping``), and a freed slot goes to a
promoted ASHA trial (resumed where it paused, no retraining) before a new trial; trials
still paused when nothing is left to run are stopped. The bookkeeping is
``torchyard.sweeps.trials``. Policies: none (the baseline); ASHA with reduction factor 3
and rungs from 1 epoch to ``--epochs`` (Ray Tune's defaults otherwise: one bracket), and
the same with a second bracket (rungs from 3 epochs); Azure ML's bandit (slack factor
0.15, delay 10: the notebook's), median (delay 5) and truncation (20 %, delay 5).

Printed per policy: trial-seconds as a ratio of the baseline's; the best accuracy found
(the best any trial reported, as the sweep reports it) and its relative gap to the
exhaustive best (the baseline's); and the true gap: the noise-free final accuracy of the
trial the sweep calls best against the best configuration in the sweep (the reported
best of 64 trials is lifted by the noise of thousands of reports, the more trials ran to
the end the more). Then the same over ``--seeds`` seeds (the range), since one seed's
figure may be lucky. The target for ASHA: at most 35 % of the baseline's trial-seconds,
within 1 % of the exhaustive best. The full run writes benchmarks/results/sweeps.json
(machine, date, figures); the figures are deterministic.

Then the samplers on the same curve family, without early stopping: ``--trials`` trials
``--slots`` at a time, each new trial drawn at random or chosen by bayesian sampling
(``torchyard.tuning.bayesian``, Optuna's TPE, from the results of the trials that ended, those
still running given as running), over ``--seeds`` seeds. Printed as bayesian's mean
regret over random's (regret: the best noise-free final accuracy of the space minus a
trial's): of the best configuration sampled, of all trials (how much of the budget went
to good configurations), and of the trial the sweep calls best (picked on noisy reports,
so on this family's broad optimum mostly decided by the noise).

    .venv/bin/python benchmarks/sweeps.py [--trials 64] [--slots 8] [--epochs 81] [--seed 0]
    .venv/bin/python benchmarks/sweeps.py --smoke
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

from benchmarks import record  # noqa: E402

from torchyard.sweeps import policies, sampling, space, stopping, trials  # noqa: E402
from torchyard.tuning import bayesian  # noqa: E402

SPACE = {
    "learning_rate": {"type": "uniform", "minValue": 0.0005, "maxValue": 0.005},
    "momentum": {"type": "uniform", "minValue": 0.9, "maxValue": 0.99},
}
GOAL = stopping.Goal.MAXIMIZE
BEST_RATE = 0.05  # the effective learning rate with the highest asymptote
START = 0.10  # accuracy before training (10 classes)
NOISE = 0.004


def true_accuracy(learning_rate: float, momentum: float, epoch: float) -> float:
    """The noise-free validation accuracy after ``epoch`` epochs."""
    effective = learning_rate / (1 - momentum)  # 0.005 .. 0.5 over the space
    x = math.log10(effective / BEST_RATE)
    a = 0.95 - 0.10 * x * x
    c = 0.12 * math.sqrt(effective / BEST_RATE)
    return a - (a - START) * math.exp(-c * epoch)


def curve(learning_rate: float, momentum: float, epochs: int, rng: random.Random) -> list[float]:
    """The validation accuracy a trial reports after epochs 1..epochs (with noise)."""
    return [
        true_accuracy(learning_rate, momentum, t) + rng.gauss(0, NOISE)
        for t in range(1, epochs + 1)
    ]


@dataclass
class Outcome:
    policy: str
    trial_seconds: float
    epochs: int
    makespan: float
    best: float
    best_trial: int
    best_true: float  # the noise-free final accuracy of the trial the sweep calls best
    stopped: int
    paused: int
    promoted: int
    completed: int
    saved_estimate: float | None


@dataclass
class Sweep:
    """The trials of one sweep: parameters, accuracy per epoch, seconds per epoch."""

    parameters: list[dict[str, space.Value]]
    curves: list[list[float]]
    durations: list[float]
    finals: list[float]  # each trial's noise-free accuracy after the last epoch


def make_sweep(count: int, epochs: int, seed: int) -> Sweep:
    search = space.parse_space(SPACE)
    parameters, curves, durations, finals = [], [], [], []
    for i in range(count):
        p = sampling.random_trial(search, seed, i)
        rng = random.Random(f"sweeps-benchmark:{seed}:{i}")
        lr, momentum = p["learning_rate"], p["momentum"]
        assert isinstance(lr, float) and isinstance(momentum, float)
        parameters.append(p)
        curves.append(curve(lr, momentum, epochs, rng))
        durations.append(0.8 + 0.4 * rng.random())
        finals.append(true_accuracy(lr, momentum, epochs))
    return Sweep(parameters, curves, durations, finals)


def simulate(
    name: str, policy: stopping.Policy | None, sweep: Sweep, slots: int, epochs: int, seed: int
) -> Outcome:
    """Run ``sweep`` ``slots`` trials at a time under ``policy`` (None: to the end)."""
    count = len(sweep.curves)
    book = trials.Book(GOAL, planned_intervals=epochs)
    histories: dict[int, list[float | None]] = {i: [] for i in range(count)}
    seconds = [0.0] * count
    asha = policy.start() if isinstance(policy, policies.Asha) else None
    queue: list[tuple[float, int]] = []  # (when the trial's next epoch ends, trial)
    running: set[int] = set()
    paused: set[int] = set()
    started = 0
    promoted = 0

    def run(trial: int, now: float) -> None:
        nonlocal book
        book = trials.fold(book, trials.Started(trial))
        running.add(trial)
        heapq.heappush(queue, (now + sweep.durations[trial], trial))

    def fill(now: float) -> None:
        nonlocal book, started, promoted
        while len(running) < slots:
            if asha is not None and isinstance(policy, policies.Asha) and paused:
                promotions = policy.promotions(GOAL, asha, paused)
                if promotions:
                    decision = promotions[0]
                    paused.discard(decision.trial)
                    book = trials.fold(book, trials.decided(book, decision))
                    promoted += 1
                    run(decision.trial, now)
                    continue
            if started < count:
                book = trials.fold(book, trials.Created(started, sweep.parameters[started]))
                run(started, now)
                started += 1
                continue
            break

    now = 0.0
    fill(now)
    while queue:
        now, trial = heapq.heappop(queue)
        history = histories[trial]
        value = sweep.curves[trial][len(history)]
        history.append(value)
        epoch = len(history)
        seconds[trial] += sweep.durations[trial]
        book = trials.fold(book, trials.Reported(trial, epoch, value, seconds[trial]))
        if epoch >= epochs:
            book = trials.fold(book, trials.Ended(trial, "completed", seconds[trial]))
            running.discard(trial)
        else:
            if policy is None:
                action = stopping.Action.CONTINUE
                decision = None
            elif isinstance(policy, policies.Asha):
                assert asha is not None
                bracket = policy.bracket(seed, trial)
                asha, decision = policy.report(GOAL, asha, trial, epoch, value, bracket)
                action = decision.action
            else:
                decision = stopping.evaluate(policy, GOAL, histories, trial)
                action = decision.action
            if action is stopping.Action.CONTINUE:
                heapq.heappush(queue, (now + sweep.durations[trial], trial))
            else:
                assert decision is not None
                book = trials.fold(book, trials.decided(book, decision))
                running.discard(trial)
                if action is stopping.Action.PAUSE:
                    paused.add(trial)
        fill(now)
    still_paused = len(paused)
    for trial in sorted(paused):  # the sweep is over: a paused trial is not resumed
        ended = stopping.Decision(trial, stopping.Action.STOP, "the sweep ended")
        book = trials.fold(book, trials.Decided(ended))
    found = trials.best(book)
    assert found is not None and found.best is not None
    states = trials.counts(book)
    return Outcome(
        policy=name,
        trial_seconds=trials.seconds_spent(book),
        epochs=sum(len(h) for h in histories.values()),
        makespan=now,
        best=found.best,
        best_trial=found.index,
        best_true=sweep.finals[found.index],
        stopped=states["Stopped"] - still_paused,
        paused=still_paused,
        promoted=promoted,
        completed=states["Completed"],
        saved_estimate=trials.seconds_saved(book),
    )


ASHA = "asha (eta 3, 1 bracket)"


def compared(epochs: int) -> list[tuple[str, stopping.Policy | None]]:
    """The baseline first; ASHA as Ray Tune's defaults but for the reduction factor (rungs
    from 1 epoch, one bracket), then with a second bracket (rungs from 3 epochs) beside it."""
    return [
        ("none (baseline)", None),
        (ASHA, policies.Asha(max_resource=epochs, min_resource=1, reduction_factor=3)),
        (
            "asha (eta 3, 2 brackets)",
            policies.Asha(max_resource=epochs, min_resource=1, reduction_factor=3, brackets=2),
        ),
        (
            "bandit (slack 0.15, delay 10)",
            policies.Bandit(slack_factor=0.15, evaluation_interval=1, delay_evaluation=10),
        ),
        ("median (delay 5)", policies.Median(evaluation_interval=1, delay_evaluation=5)),
        (
            "truncation (20 %, delay 5)",
            policies.Truncation(
                truncation_percentage=20, evaluation_interval=1, delay_evaluation=5
            ),
        ),
    ]


@dataclass
class Row:
    """One policy against the baseline. ``ratio``: trial-seconds / the baseline's.
    ``gap``: (exhaustive best - best found) / exhaustive best, in the metric the sweep
    reports (each trial's best noisy accuracy; the exhaustive best is the baseline's).
    ``gap_true``: the same in noise-free final accuracy: the trial the sweep calls best
    against the best of all the sweep's configurations."""

    outcome: Outcome
    ratio: float
    gap: float
    gap_true: float


def run_all(count: int, slots: int, epochs: int, seed: int) -> list[Row]:
    """Every policy on the same sweep; the baseline first."""
    sweep = make_sweep(count, epochs, seed)
    outcomes = [simulate(name, p, sweep, slots, epochs, seed) for name, p in compared(epochs)]
    base, exhaustive_true = outcomes[0], max(sweep.finals)
    return [
        Row(
            o,
            o.trial_seconds / base.trial_seconds,
            (base.best - o.best) / abs(base.best),
            (exhaustive_true - o.best_true) / abs(exhaustive_true),
        )
        for o in outcomes
    ]


def met(row: Row, gap: float) -> bool:
    """The target: at most 35 % of the baseline's trial-seconds, within 1 % of the best."""
    return row.ratio <= 0.35 and gap <= 0.01


def table(rows: list[Row], write: Callable[[str], None] = print) -> None:
    write(
        f"{'policy':<30} {'trial-s':>8} {'ratio':>6} {'epochs':>6} {'makespan':>8} "
        f"{'best acc':>8} {'(trial)':>7} {'gap':>6} {'true gap':>8}  "
        "stopped paused promoted completed"
    )
    for row in rows:
        o = row.outcome
        write(
            f"{o.policy:<30} {o.trial_seconds:>8.1f} {row.ratio:>6.3f} {o.epochs:>6} "
            f"{o.makespan:>8.1f} {o.best:>8.4f} {f'({o.best_trial})':>7} "
            f"{row.gap * 100:>5.2f}% {row.gap_true * 100:>7.2f}%  "
            f"{o.stopped:>7} {o.paused:>6} {o.promoted:>8} {o.completed:>9}"
        )


# -- samplers: bayesian (Optuna's TPE) against random, no early stopping ------------------


def optimum(epochs: int) -> float:
    """The best noise-free final accuracy any configuration of the space reaches: a
    function of the effective rate only, maximized over a fine grid of it."""
    best = 0.0
    for k in range(20001):
        effective = 0.005 * 100 ** (k / 20000)  # 0.005 .. 0.5, log-spaced
        best = max(best, true_accuracy(effective * 0.01, 0.99, epochs))
    return best


@dataclass
class Sampled:
    """One sampler's sweep, in regret: the best noise-free final accuracy of the space
    minus a trial's (lower is better)."""

    sampler: str
    best_trial: int  # the trial the sweep calls best (the best accuracy reported)
    called: float  # that trial's regret (its pick is made on noisy reports)
    best_config: float  # the regret of the best configuration sampled
    mean: float  # the mean regret of all trials (how much of the budget went to good ones)


def sample(sampler: str, count: int, slots: int, epochs: int, seed: int) -> Sampled:
    """``count`` trials ``slots`` at a time, each run to its end: a freed slot's new trial
    is drawn (random) or chosen by TPE from the results so far, the trials still running
    given as running (as the Sweep controller gives them)."""
    search = space.parse_space(SPACE)
    made: list[dict[str, space.Value]] = []
    scores: dict[int, float] = {}  # ended trial -> the best accuracy it reported
    pending: dict[int, float] = {}
    finals: list[float] = []
    queue: list[tuple[float, int]] = []

    def start(now: float) -> None:
        i = len(made)
        if sampler == "random":
            p = sampling.random_trial(search, seed, i)
        else:
            known = [bayesian.Result(made[j], scores.get(j), j in scores) for j in range(i)]
            p = bayesian.suggest(search, GOAL, seed, i, known)
        lr, momentum = float(p["learning_rate"]), float(p["momentum"])
        rng = random.Random(f"sweeps-benchmark:{seed}:{i}")
        made.append(p)
        finals.append(true_accuracy(lr, momentum, epochs))
        pending[i] = max(curve(lr, momentum, epochs, rng))
        heapq.heappush(queue, (now + (0.8 + 0.4 * rng.random()) * epochs, i))

    while len(made) < min(slots, count):
        start(0.0)
    while queue:
        now, i = heapq.heappop(queue)
        scores[i] = pending.pop(i)
        if len(made) < count:
            start(now)
    found = max(scores, key=lambda i: (scores[i], -i))
    top = optimum(epochs)
    return Sampled(
        sampler,
        found,
        top - finals[found],
        top - max(finals),
        statistics.fmean(top - f for f in finals),
    )


SAMPLER_FIGURES = {
    "best_config": "regret of the best configuration sampled",
    "mean": "mean regret of the trials",
    "called": "regret of the trial the sweep calls best",
}


def compare_samplers(count: int, slots: int, epochs: int, seeds: range) -> dict[str, float]:
    """Bayesian's mean regrets over ``seeds`` as ratios of random's (below 1: better)."""
    print(
        f"samplers, no early stopping, {count} trials, {slots} at a time: regret = the best "
        "noise-free final accuracy of the space minus a trial's"
    )
    print(f"  {'seed':>4}  random: best config / mean / called   bayesian: the same")
    runs: dict[str, list[Sampled]] = {"random": [], "bayesian": []}
    for seed in seeds:
        for sampler, found in runs.items():
            found.append(sample(sampler, count, slots, epochs, seed))
        r, b = runs["random"][-1], runs["bayesian"][-1]
        print(
            f"  {seed:>4}  {r.best_config:.6f} / {r.mean:.5f} / {r.called:.5f}   "
            f"{b.best_config:.6f} / {b.mean:.5f} / {b.called:.5f}"
        )
    ratios = {}
    for key, words in SAMPLER_FIGURES.items():
        mean = {s: statistics.fmean(getattr(x, key) for x in found) for s, found in runs.items()}
        ratios[key] = mean["bayesian"] / mean["random"]
        print(
            f"  bayesian / random, {words} (mean over seeds): {ratios[key]:.3f} "
            f"({mean['bayesian']:.6f} / {mean['random']:.6f})"
        )
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=81)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=10, help="seeds for the range lines")
    parser.add_argument("--smoke", action="store_true", help="16 trials, 4 slots, 9 epochs")
    record.add_argument(parser)
    args = parser.parse_args()
    rec = record.Record("sweeps", args)
    if args.smoke:
        args.trials, args.slots, args.epochs, args.seeds = 16, 4, 9, 2
    print(
        f"sweeps: {args.trials} trials, {args.slots} at a time, up to {args.epochs} epochs "
        f"each; learning_rate uniform(0.0005, 0.005), momentum uniform(0.9, 0.99); "
        f"seed {args.seed}; simulated (no training)"
    )
    rows = run_all(args.trials, args.slots, args.epochs, args.seed)
    table(rows)
    print(
        "ratio: trial-seconds / the baseline's. gap: (exhaustive best - best found) / "
        "exhaustive best in the reported metric (each trial's best noisy accuracy; the "
        "baseline's best is the exhaustive best). true gap: the same in noise-free final "
        "accuracy, the trial called best against the best configuration of the sweep"
    )
    seeds = range(args.seed, args.seed + args.seeds)
    spread: dict[str, list[Row]] = {}
    for seed in seeds:
        for row in run_all(args.trials, args.slots, args.epochs, seed):
            spread.setdefault(row.outcome.policy, []).append(row)
    print(f"over seeds {seeds[0]}..{seeds[-1]} (min / median / max):")
    for name, found in spread.items():
        r = [x.ratio for x in found]
        g = [x.gap * 100 for x in found]
        t = [x.gap_true * 100 for x in found]
        print(
            f"  {name:<30} ratio {min(r):.3f} / {statistics.median(r):.3f} / {max(r):.3f}   "
            f"gap {min(g):.2f} / {statistics.median(g):.2f} / {max(g):.2f} %   "
            f"true gap {min(t):.2f} / {statistics.median(t):.2f} / {max(t):.2f} %"
        )
    for name in (ASHA, "asha (eta 3, 2 brackets)"):
        row = next(x for x in rows if x.outcome.policy == name)
        found = spread[name]
        print(
            f"target, {name}: at most 0.35 of the baseline's trial-seconds and within 1 % of "
            f"the exhaustive best: ratio {row.ratio:.3f}, gap {row.gap * 100:.2f} % "
            f"({'met' if met(row, row.gap) else 'not met'}; met on "
            f"{sum(met(x, x.gap) for x in found)} of {len(found)} seeds), true gap "
            f"{row.gap_true * 100:.2f} % ({'met' if met(row, row.gap_true) else 'not met'}; "
            f"met on {sum(met(x, x.gap_true) for x in found)} of {len(found)} seeds)"
        )
    for x in rows:
        rec.round(**asdict(x.outcome), ratio=x.ratio, gap=x.gap, gap_true=x.gap_true)
    for name in (ASHA, "asha (eta 3, 2 brackets)"):
        row = next(x for x in rows if x.outcome.policy == name)
        found = spread[name]
        rec.figure(
            f"{name}: trial-seconds",
            row.ratio,
            "x the sweep without early stopping",
            spread=(min(x.ratio for x in found), max(x.ratio for x in found)),
            target="<= 0.35",
            met=row.ratio <= 0.35,
        )
        rec.figure(
            f"{name}: best found below the exhaustive best",
            round(row.gap * 100, 2),
            "%",
            spread=(min(x.gap for x in found) * 100, max(x.gap for x in found) * 100),
            target="<= 1 %",
            met=row.gap <= 0.01,
        )
        # the same without the noise: the reported best is the best of many noisy reports,
        # lifted the more, the more reports the sweep took (the baseline takes the most)
        rec.figure(
            f"{name}: the trial called best below the best configuration, noise-free",
            round(row.gap_true * 100, 2),
            "%",
            spread=(min(x.gap_true for x in found) * 100, max(x.gap_true for x in found) * 100),
        )
    ratios = compare_samplers(args.trials, args.slots, args.epochs, seeds)
    for key, words in SAMPLER_FIGURES.items():
        rec.figure(
            f"bayesian (TPE) against random: {words}",
            round(ratios[key], 3),
            "x random's (mean over seeds)",
        )
    rec.write()


if __name__ == "__main__":
    main()
