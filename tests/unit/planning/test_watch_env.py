"""What the launcher watches the ranks with, from the run's policy
(``planning.pods.watch_env``): node Pods and local mode get the same variables."""

from __future__ import annotations

import pytest

from tests.builders import TrainingRunBuilder
from torchyard import api, launch_logs, launch_stalls
from torchyard.planning import pods


def policy(**fields: object) -> api.TrainingRun:
    builder = TrainingRunBuilder("r", "ns")
    for name, value in fields.items():
        builder = builder.with_(f"spec.policy.{name}", value)
    return api.parse_trainingrun(builder.obj())


def test_stall_budgets_reach_the_launcher_as_json_it_reads_back() -> None:
    run = policy(stallTimeoutSeconds=60, stallBudgets={"saving": 900})
    env = pods.watch_env(run)
    assert env == {"TORCHYARD_STALL_TIMEOUT": "60", "TORCHYARD_STALL_BUDGETS": '{"saving":900}'}
    assert launch_stalls.stall_budgets(env["TORCHYARD_STALL_BUDGETS"]) == {"saving": 900.0}
    trainer = pods.pod(run, 0, image="img")["spec"]["containers"][0]
    assert {"name": "TORCHYARD_STALL_BUDGETS", "value": '{"saving":900}'} in trainer["env"]
    assert pods.watch_env(policy()) == {}


def test_a_budget_below_five_seconds_or_an_unknown_phase_is_refused() -> None:
    with pytest.raises(api.InvalidSpec, match=r"spec\.policy\.stallBudgets\.saving"):
        policy(stallBudgets={"saving": 1})
    with pytest.raises(api.InvalidSpec, match=r"spec\.policy\.stallBudgets\.lunch"):
        policy(stallBudgets={"lunch": 60})


@pytest.mark.parametrize(
    ("limit", "read"), [(None, launch_logs.LOG_LIMIT_BYTES), (8 << 20, 8 << 20)]
)
def test_the_log_limit_reaches_the_launcher_which_reads_it_back(
    limit: int | None, read: int
) -> None:
    env = pods.watch_env(policy(logLimitBytes=limit) if limit else policy())
    assert launch_logs.log_limit(env) == read


def test_a_log_limit_too_small_to_hold_the_note_is_refused() -> None:
    with pytest.raises(api.InvalidSpec, match=r"spec\.policy\.logLimitBytes"):
        policy(logLimitBytes=100)
