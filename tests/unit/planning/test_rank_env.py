"""The rank contract (docs/concepts/rank-contract.md) as the planner computes it, node by node and
process by process."""

from __future__ import annotations

import pytest

from tests.builders import TrainingRunBuilder
from torchyard import api, planning


def run_2x2(**kw: object) -> api.TrainingRun:
    body = TrainingRunBuilder("bert", "vision").nodes(2).procs(2).obj()
    return api.parse_trainingrun(body)


def test_node_env_carries_the_whole_contract() -> None:
    env = planning.node_env(run_2x2(), 1)
    assert env["MASTER_ADDR"] == "bert-0.bert.vision.svc"
    assert env["MASTER_PORT"] == "6105"
    assert env["WORLD_SIZE"] == "4"
    assert env["NODE_RANK"] == env["GROUP_RANK"] == env["PET_NODE_RANK"] == "1"
    assert env["LOCAL_WORLD_SIZE"] == env["PET_NPROC_PER_NODE"] == "2"
    assert env["PET_NNODES"] == "2"
    assert env["PET_MASTER_ADDR"] == env["MASTER_ADDR"]
    assert env["PET_MASTER_PORT"] == env["MASTER_PORT"]
    assert env["TORCHYARD_OUTPUTS"] == "./outputs"
    assert env["TORCHYARD_LOGS"] == "./logs"
    assert "RANK" not in env and "LOCAL_RANK" not in env


@pytest.mark.parametrize(
    ("node", "expected"),
    [(0, [(0, 0), (1, 1)]), (1, [(2, 0), (3, 1)])],
)
def test_each_process_gets_global_and_local_rank(
    node: int, expected: list[tuple[int, int]]
) -> None:
    envs = planning.rank_envs(run_2x2(), node)
    assert [(int(e["RANK"]), int(e["LOCAL_RANK"])) for e in envs] == expected
    assert {e["NODE_RANK"] for e in envs} == {str(node)}


def test_local_mode_overrides_address_and_port() -> None:
    env = planning.node_env(run_2x2(), 0, master_addr="127.0.0.1", master_port=40000)
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "40000")
    assert (env["PET_MASTER_ADDR"], env["PET_MASTER_PORT"]) == ("127.0.0.1", "40000")


def test_user_env_is_passed_and_cannot_shadow_the_contract() -> None:
    body = TrainingRunBuilder("r").env(NCCL_DEBUG="INFO").obj()
    env = planning.node_env(api.parse_trainingrun(body), 0)
    assert env["NCCL_DEBUG"] == "INFO"


def test_single_process_type_has_no_rendezvous() -> None:
    body = TrainingRunBuilder("r").with_("spec.distribution.type", "none").obj()
    env = planning.node_env(api.parse_trainingrun(body), 0)
    assert "MASTER_ADDR" not in env and "MASTER_PORT" not in env
    assert env["WORLD_SIZE"] == "1"


def test_node_rank_out_of_range_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"outside 0\.\.1"):
        planning.node_env(run_2x2(), 2)


def test_export_onnx_is_told_to_the_script() -> None:
    body = TrainingRunBuilder("r").register("m", exportOnnx=True).obj()
    assert planning.node_env(api.parse_trainingrun(body), 0)["TORCHYARD_EXPORT_ONNX"] == "1"


def test_node_env_names_the_run_and_how_it_launches() -> None:
    env = planning.node_env(run_2x2(), 0)
    assert env["TORCHYARD_RUN"] == "bert"
    assert env["TORCHYARD_NAMESPACE"] == "vision"
    assert env["TORCHYARD_LAUNCH"] == "process"
    assert env["TORCHYARD_NNODES"] == "2"
    assert env["TORCHYARD_NPROC_PER_NODE"] == "2"


def test_every_process_gets_the_local_address_and_port() -> None:
    envs = planning.rank_envs(run_2x2(), 1, master_addr="127.0.0.1", master_port=40000)
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("127.0.0.1", "40000")}
