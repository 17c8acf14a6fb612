"""The Azure ML names: how a ScriptRunConfig's distribution maps onto a TrainingRun, and
the clear errors where an Azure concept has no meaning here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.builders import TrainingRunBuilder
from torchyard import k8s
from torchyard.sdk import (
    Experiment,
    MpiConfiguration,
    PyTorchConfiguration,
    Run,
    ScriptRunConfig,
    TorchyardSdkError,
    Workspace,
    runs,
)
from torchyard.sdk.azureml.common import dns_name as _dns


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
    src = ScriptRunConfig(
        ".",
        script="train.py",
        distributed_job_config=MpiConfiguration(process_count_per_node=4, node_count=2),
    )
    assert src._distribution()["type"] == "mpi"


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


AZURE_NAMES = sorted(
    [
        "AciWebservice",
        "ActivityFailedException",
        "AksWebservice",
        "DeploymentConfiguration",
        "InferenceConfig",
        "Webservice",
        "WebserviceException",
        "AmlCompute",
        "ComputeTarget",
        "ComputeTargetException",
        "Dataset",
        "Datastore",
        "Environment",
        "Experiment",
        "Model",
        "MpiConfiguration",
        "PyTorchConfiguration",
        "Run",
        "ScriptRunConfig",
        "TorchyardSdkError",
        "Workspace",
        # azureml.train.hyperdrive
        "BanditPolicy",
        "BayesianParameterSampling",
        "GridParameterSampling",
        "HyperDriveConfig",
        "HyperDriveRun",
        "MedianStoppingPolicy",
        "NoTerminationPolicy",
        "PrimaryMetricGoal",
        "RandomParameterSampling",
        "TruncationSelectionPolicy",
        *("choice", "randint", "uniform", "quniform", "loguniform", "qloguniform"),
        *("normal", "qnormal", "lognormal", "qlognormal"),
    ]
)


def test_the_azureml_package_is_a_face_over_modules_by_concern() -> None:
    """``from torchyard.sdk import X`` and ``from torchyard.sdk.azureml import X`` keep
    working for every Azure name; the code lives in modules of at most ~400 lines."""
    import torchyard.sdk
    from torchyard.sdk import azureml

    assert sorted(azureml.__all__) == AZURE_NAMES
    assert sorted(torchyard.sdk.__all__) == sorted(
        [*AZURE_NAMES, "RegistryClient", "RegistryError"]
    )
    package = Path(azureml.__file__).parent
    modules = {p.stem for p in package.glob("*.py")} - {"__init__"}
    assert len(modules) >= 5
    for name in AZURE_NAMES:
        defined_in = getattr(azureml, name).__module__
        assert defined_in.rsplit(".", 1)[-1] in modules, (name, defined_in)
        assert getattr(torchyard.sdk, name) is getattr(azureml, name)
    face = Path(azureml.__file__).read_text()
    assert len(face.splitlines()) <= 40
    assert {type(node).__name__ for node in ast.parse(face).body} <= {
        "Expr",
        "ImportFrom",
        "Assign",
    }
    assert all(len(p.read_text().splitlines()) <= 400 for p in package.glob("*.py"))


def test_register_model_without_a_kubeconfig_says_what_to_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registry is reached through the apiserver: no kubeconfig is the SDK's error with
    the same advice as every command's (k8s.Unreachable), not a bare client exception."""
    body = TrainingRunBuilder("birds", "team").register("birds").obj()
    body["status"] = {"phase": "Succeeded"}
    monkeypatch.setattr(runs, "get", lambda ns, name: body)
    monkeypatch.setattr(k8s, "get_or_none", lambda *a: None)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    k8s.reset()
    run = Run(Experiment(Workspace(namespace="team"), "birds"), "birds")
    try:
        with pytest.raises(TorchyardSdkError) as err:
            run.register_model("birds", "outputs/model.pt")
    finally:
        k8s.reset()
    assert str(err.value).startswith("cannot register birds: cannot reach the Kubernetes API")
    assert str(err.value).endswith(f"; {k8s.errors.ADVICE}")
