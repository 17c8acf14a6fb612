"""The Azure ML names of deployment (torchyard.sdk.azureml.deployments, webservices): what
a deployment configuration sets on an OnlineEndpoint, Azure's defaults (ACI: one Pod;
AKS: autoscaling), the arguments refused (never dropped), and how a Webservice's state and
failure read. The whole flow (Model.deploy, wait_for_deployment, run, get_logs, delete)
runs against a real cluster on the real node: tests/node/test_endpoints_on_node.py."""

from __future__ import annotations

import pytest

from torchyard import api
from torchyard.sdk import AciWebservice, AksWebservice, Environment, InferenceConfig
from torchyard.sdk.azureml import webservices
from torchyard.sdk.azureml.common import TorchyardSdkError


def spec_of(config: webservices.DeploymentConfiguration) -> api.OnlineEndpointSpec:
    body = {
        "apiVersion": api.API_VERSION,
        "kind": "OnlineEndpoint",
        "metadata": {"name": "aci-birds", "namespace": "a"},
        "spec": {
            "model": {"uri": "model://pytorch-birds/1"},
            "environment": "pytorch",
            "entryScript": "pytorch_score.py",
            **config.spec(),
        },
    }
    return api.parse_endpoint(body).spec


def test_the_notebooks_aci_configuration() -> None:
    config = AciWebservice.deploy_configuration(
        cpu_cores=2,
        memory_gb=2,
        tags={"data": "birds", "method": "transfer learning", "framework": "pytorch"},
        description="Classify turkey/chickens using transfer learning with PyTorch",
    )
    spec = spec_of(config)
    assert (spec.resources.cpu, spec.resources.memory, spec.resources.gpus) == (
        "2000m",
        "2048Mi",
        0,
    )
    assert spec.replicas == 1 and spec.autoscaling is None
    assert spec.public is False  # a caller needs a token unless auth_enabled=False
    assert config.tags["method"] == "transfer learning"
    assert spec_of(AciWebservice.deploy_configuration(auth_enabled=False)).public is True
    assert (
        spec_of(AciWebservice.deploy_configuration(cpu_cores=0.5, gpu_cores=1)).resources.gpus == 1
    )


@pytest.mark.parametrize(
    "given",
    [
        {"ssl_enabled": True},
        {"primary_key": "k"},
        {"location": "westeurope"},
        {"enable_app_insights": True},
        {"dns_name_label": "birds"},
    ],
)
def test_what_a_cluster_cannot_honour_is_refused_by_name(given: dict[str, object]) -> None:
    with pytest.raises(TorchyardSdkError, match=next(iter(given))):
        AciWebservice.deploy_configuration(**given)  # type: ignore[arg-type]


def test_aks_autoscales_by_default_as_azure_does() -> None:
    spec = spec_of(AksWebservice.deploy_configuration())
    assert spec.autoscaling is not None
    assert (spec.autoscaling.min_replicas, spec.autoscaling.max_replicas) == (1, 10)
    assert spec.autoscaling.target_cpu_utilization == 70 and spec.resources.cpu == "100m"
    fixed = spec_of(
        AksWebservice.deploy_configuration(
            num_replicas=3, scoring_timeout_ms=1500, replica_max_concurrent_requests=8
        )
    )
    assert fixed.replicas == 3 and fixed.autoscaling is None
    assert (fixed.limits.request_timeout_seconds, fixed.limits.concurrency) == (2, 8)
    scaled = spec_of(
        AksWebservice.deploy_configuration(
            autoscale_min_replicas=2,
            autoscale_max_replicas=4,
            autoscale_target_utilization=50,
            cpu_cores=1,
        )
    )
    assert scaled.autoscaling is not None and scaled.autoscaling.max_replicas == 4
    with pytest.raises(TorchyardSdkError, match="give one of them"):
        AksWebservice.deploy_configuration(num_replicas=2, autoscale_enabled=True)
    with pytest.raises(TorchyardSdkError, match="namespace"):
        AksWebservice.deploy_configuration(namespace="other")


def test_an_inference_config_needs_an_environment_and_takes_no_docker_steps() -> None:
    with pytest.raises(TorchyardSdkError, match=r"environment=\.\.\."):
        InferenceConfig(entry_script="pytorch_score.py")
    with pytest.raises(TorchyardSdkError, match="conda_file"):
        InferenceConfig(entry_script="s.py", conda_file="env.yml", environment=Environment("e"))
    config = InferenceConfig(
        entry_script="pytorch_score.py", environment=Environment("pytorch-1.6-gpu")
    )
    assert config.source_directory is None and config.environment is not None


def test_a_state_and_a_failure_read_as_in_azure_ml() -> None:
    assert webservices.STATES["Ready"] == "Healthy"
    assert webservices.STATES["Deploying"] == "Transitioning"
    assert (
        webservices.STATES["Failed"] == "Failed" and webservices.STATES["Degraded"] == "Unhealthy"
    )
    text = webservices._failure_text(
        "aci-birds",
        {
            "phase": "Failed",
            "message": "Pod x fails (PythonException)",
            "failure": {"message": "KeyError: 'w'"},
        },
    )
    assert "Pod x fails" in text and "KeyError: 'w'" in text and "get_logs()" in text
