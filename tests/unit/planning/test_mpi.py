"""``distributions.mpi``: the hostfile, mpirun's arguments, the variables of an MPI run and
its key Secret, and how the node Pods carry them (``pods.pod``, ``pods.key_secret``)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder
from torchyard import api, distributions
from torchyard.distributions import mpi
from torchyard.planning import pods

KEY_MOUNT = {"name": "mpi-key", "mountPath": mpi.KEY_FILE.rsplit("/", 1)[0], "readOnly": True}


def mpi_run(nodes: int = 2, procs: int = 2, **dist: Any) -> api.TrainingRun:
    builder = TrainingRunBuilder("hvd", "team").nodes(nodes).procs(procs)
    builder = builder.with_("spec.distribution.type", "mpi")
    for key, value in dist.items():
        builder = builder.with_(f"spec.distribution.{key}", value)
    return api.parse_trainingrun(builder.obj())


def test_hostfile_names_every_node_pod_by_its_service_with_its_slots() -> None:
    run = mpi_run(3, 4)
    hostfile = mpi.hostfile(run.spec.distribution, pods.place(run).hosts)
    assert hostfile == "hvd-0.hvd slots=4\nhvd-1.hvd slots=4\nhvd-2.hvd slots=4\n"


def test_local_hostfile_puts_every_slot_on_this_machine() -> None:
    assert mpi.hostfile(mpi_run(2, 3).spec.distribution) == "localhost slots=6\n"


def test_mpirun_args_start_the_world_size_by_slot_with_tagged_output() -> None:
    args = mpi.mpirun_args(mpi_run(2, 2).spec.distribution)
    assert args[:2] == ["-np", "4"]
    assert args[args.index("--map-by") + 1] == "slot"
    assert args[args.index("--bind-to") + 1] == "none"
    assert "--tag-output" in args
    assert "--leave-session-attached" in args  # orted stays in the agent's session
    mca = {args[i + 1]: args[i + 2] for i, a in enumerate(args) if a == "--mca"}
    assert mca == {
        "btl": "tcp,self,vader",
        "btl_vader_single_copy_mechanism": "none",
        "plm_rsh_no_tree_spawn": "1",
        "orte_base_help_aggregate": "0",
    }


def test_extra_mpirun_args_come_last() -> None:
    args = mpi.mpirun_args(
        mpi_run(mpirunArgs=["--mca", "btl_tcp_if_include", "eth0"]).spec.distribution
    )
    assert args[-3:] == ["--mca", "btl_tcp_if_include", "eth0"]


@pytest.mark.parametrize("node", [0, 1])
def test_node_pods_carry_the_mpi_variables_beside_the_rank_contract(node: int) -> None:
    run = mpi_run(2, 2, masterPort=7000)
    pod = pods.pod(run, node, image="img")
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["TORCHYARD_DISTRIBUTION"] == "mpi"
    assert env["TORCHYARD_MPI_HOSTFILE"] == "hvd-0.hvd slots=2\nhvd-1.hvd slots=2\n"
    assert json.loads(env["TORCHYARD_MPIRUN_ARGS"]) == mpi.mpirun_args(run.spec.distribution)
    assert env["TORCHYARD_MPI_PORT"] == "7001"
    assert env["TORCHYARD_MPI_KEY_FILE"] == mpi.KEY_FILE
    assert env["TORCHYARD_MPI_DOMAIN"] == "hvd"
    # torchyard's part of the rank contract; OMPI_COMM_WORLD_* come from mpirun
    assert env["MASTER_ADDR"] == "hvd-0.hvd.team.svc"
    assert env["MASTER_PORT"] == "7000"
    assert env["TORCHYARD_OUTPUTS"].endswith("/outputs")
    assert env["TORCHYARD_LOGS"].endswith("/logs")
    assert not any(name.startswith("OMPI_") for name in env)
    assert "RANK" not in env
    assert {"name": "mpi-agent", "containerPort": 7001} in container["ports"]
    assert KEY_MOUNT in container["volumeMounts"]
    assert {"name": "mpi-key", "secret": {"secretName": "hvd-mpi", "defaultMode": 0o444}} in pod[
        "spec"
    ]["volumes"]


def test_pytorch_runs_get_no_mpi_parts() -> None:
    run = api.parse_trainingrun(TrainingRunBuilder("pt", "team").nodes(2).obj())
    pod = pods.pod(run, 1, image="img")
    names = {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    assert not any(n.startswith("TORCHYARD_MPI") for n in names)
    assert "TORCHYARD_DISTRIBUTION" not in names
    assert all(v["name"] != "mpi-key" for v in pod["spec"]["volumes"])


def test_local_env_has_no_agent_and_no_key() -> None:
    env = distributions.get("mpi").launcher_env(mpi_run(2, 2).spec.distribution, None)
    assert env["TORCHYARD_MPI_HOSTFILE"] == "localhost slots=4\n"
    assert "TORCHYARD_MPI_PORT" not in env and "TORCHYARD_MPI_KEY_FILE" not in env


def test_the_key_secret_is_owned_by_the_run_and_holds_the_key_it_was_given() -> None:
    run = mpi_run()
    owner = pods.owner_reference(run)
    secret = pods.key_secret(run, "k" * 64)
    assert secret["metadata"]["name"] == "hvd-mpi"
    assert secret["metadata"]["namespace"] == "team"
    assert secret["metadata"]["ownerReferences"] == [owner]
    assert base64.b64decode(secret["data"]["key"]).decode() == "k" * 64
