"""benchmarks/sweeps.py at a tiny size: every policy runs the same synthetic sweep, none
uses more trial-seconds than the baseline or more slots than it has, and the figures are
the same on every run (the figures themselves are the benchmark's to print, not judged)."""

from __future__ import annotations

from benchmarks import sweeps


def test_every_policy_runs_the_same_sweep_within_its_slots() -> None:
    rows = sweeps.run_all(count=12, slots=3, epochs=9, seed=0)
    assert [r.outcome.policy for r in rows] == [name for name, _ in sweeps.compared(9)]
    base = rows[0]
    assert (base.ratio, base.gap) == (1.0, 0.0) and base.outcome.completed == 12
    assert base.outcome.epochs == 12 * 9
    for row in rows:
        o = row.outcome
        assert 0 < o.trial_seconds <= base.outcome.trial_seconds + 1e-9
        assert o.trial_seconds <= o.makespan * 3 + 1e-9  # never more than 3 at a time
        assert o.completed + o.stopped + o.paused == 12
        assert row.gap >= 0 and row.gap_true >= 0
    asha = rows[1].outcome
    assert asha.trial_seconds < base.outcome.trial_seconds and asha.completed >= 1


def test_the_figures_are_deterministic() -> None:
    assert sweeps.run_all(8, 2, 9, seed=3) == sweeps.run_all(8, 2, 9, seed=3)
    assert sweeps.run_all(8, 2, 9, seed=3) != sweeps.run_all(8, 2, 9, seed=4)


def test_the_table_has_a_line_per_policy() -> None:
    lines: list[str] = []
    sweeps.table(sweeps.run_all(8, 2, 9, seed=0), lines.append)
    assert len(lines) == 1 + len(sweeps.compared(9))
    assert lines[1].startswith("none (baseline)") and " 1.000 " in lines[1]


def test_both_samplers_run_every_trial_to_its_end_and_bayesian_is_deterministic() -> None:
    for sampler in ("random", "bayesian"):
        found = sweeps.sample(sampler, count=14, slots=3, epochs=9, seed=1)
        assert 0 <= found.best_trial < 14
        assert 0 <= found.best_config <= found.called and found.best_config <= found.mean
    assert sweeps.sample("bayesian", 14, 3, 9, seed=1) == sweeps.sample("bayesian", 14, 3, 9, 1)
    # the first trials are TPE's random start-up: no result to learn from yet
    assert sweeps.sample("bayesian", 14, 3, 9, 1) != sweeps.sample("random", 14, 3, 9, 1)
