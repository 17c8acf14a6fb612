"""The Azure ML names: how a ScriptRunConfig's distribution maps onto a TrainingRun, and
the clear errors where an Azure concept has no meaning here."""

from __future__ import annotations

import pytest

from torchyard.sdk import (
    MpiConfiguration,
    PyTorchConfiguration,
    ScriptRunConfig,
    TorchyardSdkError,
    Workspace,
)
from torchyard.sdk.azureml import _dns


def test_pytorch_configuration_splits_processes_over_nodes() -> None:
    src = ScriptRunConfig(
        ".",
        script="train.py",
        distributed_job_config=PyTorchConfiguration(process_count=4, node_count=2),
    )
    assert src._distribution() == {
        "type": "pytorch",
        "nodeCount": 2,
        "processCountPerNode": 2,
        "launch": "process",
    }


def test_a_command_runs_once_per_node_and_starts_the_processes_itself() -> None:
    launch = "python -m torch.distributed.launch --nproc_per_node 4 --nnodes 2 train.py"
    src = ScriptRunConfig(
        ".",
        command=launch.split(),
        distributed_job_config=PyTorchConfiguration(process_count=8, node_count=2),
    )
    assert src._distribution()["launch"] == "node"
    assert src._distribution()["processCountPerNode"] == 4


def test_arguments_become_strings() -> None:
    src = ScriptRunConfig(
        ".",
        script="train.py",
        arguments=["--num_epochs", 30, "--rank", "$RANK"],
        distributed_job_config=PyTorchConfiguration(process_count=8, node_count=2),
    )
    assert src.arguments == ["--num_epochs", "30", "--rank", "$RANK"]
    assert src._distribution()["processCountPerNode"] == 4


def test_mpi_configuration_is_not_silently_a_pytorch_run() -> None:
    with pytest.raises(TorchyardSdkError, match=r"distribution\.type mpi is not supported yet"):
        ScriptRunConfig(
            ".",
            script="train.py",
            distributed_job_config=MpiConfiguration(process_count_per_node=4, node_count=2),
        )


def test_what_has_no_meaning_here_says_what_to_do() -> None:
    with pytest.raises(TorchyardSdkError, match="does not split evenly"):
        ScriptRunConfig(
            ".",
            script="t.py",
            distributed_job_config=PyTorchConfiguration(process_count=3, node_count=2),
        )._distribution()
    with pytest.raises(TorchyardSdkError, match="Kubernetes namespace"):
        Workspace("subscription", "resource-group", "ws")
    with pytest.raises(TorchyardSdkError, match="script= or command="):
        ScriptRunConfig(".")


def test_azure_names_become_kubernetes_names() -> None:
    assert _dns("Tutorial-pytorch-birds") == "tutorial-pytorch-birds"
    assert _dns("pytorch-1.6-gpu") == "pytorch-1-6-gpu"
    assert _dns("AzureML__PyTorch") == "azureml-pytorch"
