"""What the launcher watches the ranks with, from the run's policy
(``planning.pods.watch_env``): node Pods and local mode get the same variables."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from tests.builders import TrainingRunBuilder
from torchyard import api
from torchyard.launch import output, stalls
from torchyard.local.runs import LocalRun
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
    assert stalls.stall_budgets(env["TORCHYARD_STALL_BUDGETS"]) == {"saving": 900.0}
    trainer = pods.pod(run, 0, image="img")["spec"]["containers"][0]
    assert {"name": "TORCHYARD_STALL_BUDGETS", "value": '{"saving":900}'} in trainer["env"]
    assert pods.watch_env(policy()) == {}


def test_a_budget_below_five_seconds_or_an_unknown_phase_is_refused() -> None:
    with pytest.raises(api.InvalidSpec, match=r"spec\.policy\.stallBudgets\.saving"):
        policy(stallBudgets={"saving": 1})
    with pytest.raises(api.InvalidSpec, match=r"spec\.policy\.stallBudgets\.lunch"):
        policy(stallBudgets={"lunch": 60})


@pytest.mark.parametrize(("limit", "read"), [(None, output.LOG_LIMIT_BYTES), (8 << 20, 8 << 20)])
def test_the_log_limit_reaches_the_launcher_which_reads_it_back(
    limit: int | None, read: int
) -> None:
    env = pods.watch_env(policy(logLimitBytes=limit) if limit else policy())
    assert output.log_limit(env) == read


def pod_env(run: api.TrainingRun, settings: pods.Settings) -> dict[str, str]:
    trainer = pods.pod(run, 0, image="img", settings=settings)["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in trainer["env"]}


@pytest.mark.parametrize(
    ("own", "operators", "read"),
    [
        (None, 1 << 20, 1 << 20),  # none of its own: the operator's default
        (8192, 1 << 20, 8192),  # its own wins over the operator's
        (8192, None, 8192),
        (None, None, output.LOG_LIMIT_BYTES),  # neither: the launcher's default
    ],
    ids=["operators-default", "own-over-default", "own-only", "launchers-default"],
)
def test_a_run_without_its_own_log_limit_gets_the_operators_default(
    own: int | None, operators: int | None, read: int
) -> None:
    run = policy(logLimitBytes=own) if own else policy()
    env = pod_env(run, pods.Settings(log_limit_bytes=operators))
    assert output.log_limit(env) == read
    assert ("TORCHYARD_LOG_LIMIT_BYTES" in env) is (own is not None or operators is not None)


def test_a_log_limit_too_small_to_hold_the_note_is_refused() -> None:
    with pytest.raises(api.InvalidSpec, match=r"spec\.policy\.logLimitBytes"):
        policy(logLimitBytes=100)


# Where node 0 and the node's folders are, which attempt, MPI's hostfile: a Pod's and a
# local run's differ by design.
WHERE = {
    "MASTER_ADDR",
    "MASTER_PORT",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
    "TORCHYARD_OUTPUTS",
    "TORCHYARD_LOGS",
    "TORCHYARD_MPI_HOSTFILE",
    "TORCHYARD_CHECKPOINT_ATTEMPT",
    "TORCHYARD_CHECKPOINT_DIR",
}


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"distribution": {"type": "mpi", "nodeCount": 2, "processCountPerNode": 2}},
        {"checkpoints": {"claimName": "c", "interval": 10}},
        {"policy": {"stallTimeoutSeconds": 100, "logLimitBytes": 8192}},
    ],
    ids=["plain", "mpi", "checkpoints", "policy"],
)
def test_a_node_pod_and_local_mode_start_the_launcher_with_the_same_variables(
    spec: dict[str, object], tmp_path: Path
) -> None:
    """One function (``pods.launcher_env``) makes the launcher's variables for both."""
    builder = TrainingRunBuilder("r", "ns")
    for field, value in spec.items():
        builder = builder.with_(f"spec.{field}", value)
    run = api.parse_trainingrun(builder.obj())
    container = pods.pod(run, 0, image="img")["spec"]["containers"][0]
    in_pod = {e["name"]: e["value"] for e in container["env"]}
    node = LocalRun(
        run, tmp_path, [], None, store_root=tmp_path, workroot=tmp_path, out=io.StringIO(), grace=10
    )
    local = node._env(0, 29500)
    # (local=True: one mpirun over this machine's slots; a Pod adds the MPI agent's channel)
    shared = pods.launcher_env(run, 0, workdir=".", grace_period=10, attempt="a", local=True)
    assert shared.keys() <= in_pod.keys() and shared.keys() <= local.keys()
    for name in shared.keys() - WHERE:
        assert in_pod[name] == local[name] == shared[name], name
