"""Every argument of the Azure ML names either works or raises: one row per argument
that torchyard cannot honour (given a value other than its default, it must raise and
say what to do), and rows for those it honours (their value reaches the TrainingRun,
the Environment or the check it stands for). ``MpiConfiguration`` submits an MPI run.
The cluster is a fake of torchyard's own ``k8s`` surface."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from torchyard import k8s
from torchyard.sdk import (
    AmlCompute,
    ComputeTarget,
    ComputeTargetException,
    Environment,
    Experiment,
    MpiConfiguration,
    PyTorchConfiguration,
    Run,
    ScriptRunConfig,
    TorchyardSdkError,
    Workspace,
    azureml,
    snapshots,
)

NS = "team"


def node(name: str, ready: bool = True, instance_type: str | None = None) -> dict[str, Any]:
    labels = {"torchyard.dev/pool": "a100"}
    if instance_type:
        labels[azureml.compute.INSTANCE_TYPE_LABEL] = instance_type
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


@pytest.fixture
def nodes(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The pool ``a100``'s nodes (the test may change the list)."""
    pool: list[dict[str, Any]] = [node("a100-0"), node("a100-1")]

    def list_(res: k8s.Resource, namespace: str | None = None, **kw: Any) -> list[dict[str, Any]]:
        assert res is k8s.NODES
        return [n for n in pool if kw.get("label_selector") in (None, "torchyard.dev/pool=a100")]

    monkeypatch.setattr(k8s, "list_", list_)
    return pool


def ws(**kw: Any) -> Workspace:
    return Workspace(namespace=NS, image_repository="reg.local/envs", **kw)


def env_with(**changes: Any) -> Environment:
    env = Environment("e")
    for path, value in changes.items():
        section, _, attr = path.partition("__")
        setattr(getattr(env, section) if attr else env, attr or section, value)
    return env


def src(**kw: Any) -> ScriptRunConfig:
    """A run for the cluster's pool "cpu" (no compute target is the local one)."""
    return ScriptRunConfig(".", script="train.py", **{"compute_target": "cpu", **kw})


CPU_NODE = {"metadata": {"name": "n1", "labels": {"torchyard.dev/pool": "cpu"}}, "status": {}}


# -- refused: (call, what the error must say) ---------------------------------------------

REFUSED: list[tuple[str, Callable[[], Any], str]] = [
    ("Workspace(subscription_id)", lambda: Workspace("sub", "rg", "ws"), "Kubernetes namespace"),
    ("Workspace.get(auth)", lambda: Workspace.get("ns", auth=object()), "auth has no meaning"),
    (
        "Workspace.get(subscription_id)",
        lambda: Workspace.get("ns", subscription_id="s"),
        "subscription_id has no meaning",
    ),
    (
        "Workspace.get(resource_group)",
        lambda: Workspace.get("ns", resource_group="rg"),
        "resource_group has no meaning",
    ),
    ("Workspace.get(location)", lambda: Workspace.get("ns", location="westeurope"), "location"),
    ("Workspace.get(cloud)", lambda: Workspace.get("ns", cloud="AzureChinaCloud"), "cloud"),
    ("Workspace.get(id)", lambda: Workspace.get("ns", id="/subscriptions/x"), "id has no"),
    (
        "provisioning_configuration(unknown)",
        lambda: AmlCompute.provisioning_configuration(vm_sise="STANDARD_NC6"),
        "unknown argument(s) vm_sise",
    ),
    (
        "Environment.get(version)",
        lambda: Environment.get(ws(), "pytorch", version="3"),
        "Environments have no versions",
    ),
    (
        "docker.enabled=False",
        lambda: env_with(docker__enabled=False)._resource(ws()),
        "every run is a container",
    ),
    (
        "base_dockerfile with pip",
        lambda: env_with(
            docker__base_dockerfile="FROM x", python__pip_requirements=["a"]
        )._resource(ws()),
        "built as written",
    ),
    (
        "base_dockerfile with base_image",
        lambda: env_with(docker__base_dockerfile="FROM x", docker__base_image="y")._resource(ws()),
        "built as written",
    ),
    (
        "user_managed_dependencies with pip",
        lambda: env_with(
            python__user_managed_dependencies=True,
            docker__base_image="img",
            python__pip_requirements=["a"],
        )._resource(ws()),
        "user_managed_dependencies=True runs docker.base_image as it is",
    ),
    (
        "user_managed_dependencies without an image",
        lambda: env_with(python__user_managed_dependencies=True)._resource(ws()),
        "needs a base_image",
    ),
    (
        "environment_variables on a prebuilt image",
        lambda: env_with(image="img:1", environment_variables={"A": "1"})._resource(ws()),
        "environment_variables need a build",
    ),
    (
        "communication_backend=Gloo",
        lambda: PyTorchConfiguration(communication_backend="Gloo"),
        "init_process_group(backend=...)",
    ),
    ("node_count=0", lambda: PyTorchConfiguration(node_count=0), "node_count must be"),
    ("process_count=0", lambda: PyTorchConfiguration(process_count=0), "process_count must be"),
    (
        "MpiConfiguration(node_count=0)",
        lambda: MpiConfiguration(process_count_per_node=4, node_count=0),
        "node_count must be a whole number >= 1",
    ),
    ("run_config", lambda: src(run_config=object()), "run_config has no meaning"),
    (
        "docker_runtime_config",
        lambda: src(docker_runtime_config=object()),
        "docker_runtime_config has no meaning",
    ),
    ("resume_from", lambda: src(resume_from="ckpt"), "resume_from has no meaning"),
    ("_telemetry_values", lambda: src(_telemetry_values={"a": 1}), "_telemetry_values"),
    (
        "script and command",
        lambda: ScriptRunConfig(".", script="t.py", command=["python", "t.py"]),
        "not both",
    ),
    (
        "an unknown distributed_job_config",
        lambda: src(distributed_job_config=object()),
        "use PyTorchConfiguration",
    ),
    (
        "max_run_duration_seconds=0",
        lambda: src(max_run_duration_seconds=0),
        "max_run_duration_seconds must be",
    ),
    ("neither script nor command", lambda: ScriptRunConfig("."), "script= or command="),
    (
        "process_count not splitting evenly",
        lambda: src(
            distributed_job_config=PyTorchConfiguration(process_count=3, node_count=2)
        )._distribution(),
        "does not split evenly",
    ),
]


@pytest.mark.parametrize(("call", "says"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_an_argument_torchyard_cannot_honour_raises_with_advice(
    call: Callable[[], Any], says: str, nodes: list[dict[str, Any]]
) -> None:
    with pytest.raises(TorchyardSdkError) as info:
        call()
    assert says in str(info.value)


def test_mpi_configuration_makes_an_mpi_run_of_nodes_by_slots() -> None:
    src = ScriptRunConfig(
        ".",
        script="train.py",
        distributed_job_config=MpiConfiguration(process_count_per_node=4, node_count=2),
    )
    assert src._distribution() == {"type": "mpi", "nodeCount": 2, "processCountPerNode": 4}


# -- register_model: refused before anything is read or written ----------------------------


@pytest.mark.parametrize(
    "argument",
    ["datasets", "sample_input_dataset", "sample_output_dataset", "resource_configuration"],
)
def test_register_model_refuses_what_has_no_home_here(
    argument: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(k8s, "get", lambda *a, **k: pytest.fail("read the run"))
    run = Run(Experiment(ws(), "birds"), "birds-abc")
    with pytest.raises(TorchyardSdkError, match=f"{argument} has no meaning here"):
        run.register_model("birds", **{argument: ["something"]})


# -- compute: create checks the existing pool, wait_for_completion waits ---------------------

CREATE: list[tuple[str, dict[str, Any], str | None]] = [
    ("nothing asked", {}, None),
    ("min_nodes met", {"min_nodes": 2}, None),
    ("min_nodes not met", {"min_nodes": 3}, "fewer than min_nodes=3"),
    ("max_nodes met", {"max_nodes": 4}, None),
    ("max_nodes exceeded", {"max_nodes": 1}, "more than max_nodes=1"),
    ("vm_size unknown", {"vm_size": "STANDARD_NC6"}, "is not all vm_size='STANDARD_NC6'"),
    ("vm_priority", {"vm_priority": "lowpriority"}, "vm_priority would shape nodes"),
    (
        "idle_seconds_before_scaledown",
        {"idle_seconds_before_scaledown": 60},
        "idle_seconds_before_scaledown would shape nodes",
    ),
    ("admin_username", {"admin_username": "me"}, "admin_username would shape nodes"),
    ("enable_node_public_ip", {"enable_node_public_ip": False}, "enable_node_public_ip"),
]


@pytest.mark.parametrize(("asked", "says"), [r[1:] for r in CREATE], ids=[r[0] for r in CREATE])
def test_create_is_the_existing_pool_checked_against_the_configuration(
    asked: dict[str, Any], says: str | None, nodes: list[dict[str, Any]]
) -> None:
    config = AmlCompute.provisioning_configuration(**asked)
    if says is None:
        assert ComputeTarget.create(ws(), "a100", config).pool == "a100"
    else:
        with pytest.raises(ComputeTargetException) as info:
            ComputeTarget.create(ws(), "a100", config)
        assert says in str(info.value)


def test_create_accepts_a_vm_size_the_nodes_are_labelled_with(nodes: list[dict[str, Any]]) -> None:
    nodes[:] = [node(f"a100-{i}", instance_type="Standard_NC6") for i in range(2)]
    config = AmlCompute.provisioning_configuration(vm_size="STANDARD_NC6", max_nodes=4)
    assert ComputeTarget.create(ws(), "a100", config).pool == "a100"
    nodes[1] = node("a100-1", instance_type="Standard_ND40")
    with pytest.raises(ComputeTargetException, match="Standard_ND40"):
        ComputeTarget.create(ws(), "a100", config)


def test_wait_for_completion_waits_for_min_node_count_until_its_timeout(
    nodes: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes[:] = [node("a100-0"), node("a100-1", ready=False)]
    target = ComputeTarget(ws(), "a100")
    target.wait_for_completion(min_node_count=1, timeout_in_minutes=0)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        nodes[1] = node("a100-1")  # the second node becomes Ready meanwhile

    monkeypatch.setattr(azureml.compute.time, "sleep", sleep)
    target.wait_for_completion(min_node_count=2, timeout_in_minutes=1)
    assert len(sleeps) == 1, "it looked again instead of failing at once"
    nodes[1] = node("a100-1", ready=False)
    target = ComputeTarget(ws(), "a100")
    monkeypatch.setattr(azureml.compute.time, "sleep", lambda s: None)
    with pytest.raises(ComputeTargetException, match="fewer than 2, after 0 minutes"):
        target.wait_for_completion(min_node_count=2, timeout_in_minutes=0)
    with pytest.raises(ComputeTargetException, match="never deletes node pools"):
        target.wait_for_completion(is_delete_operation=True)


# -- honoured: what reaches the resources ---------------------------------------------------


def test_user_managed_dependencies_run_the_base_image_as_it_is() -> None:
    env = env_with(python__user_managed_dependencies=True, docker__base_image="acme/torch:2")
    assert env._resource(ws())["spec"] == {"image": "acme/torch:2"}


def test_pip_on_top_of_a_prebuilt_image_builds_on_that_image() -> None:
    env = env_with(image="acme/torch:2", python__pip_requirements=["pillow"])
    spec = env._resource(ws())["spec"]
    assert (spec["baseImage"], spec["pip"]) == ("acme/torch:2", ["pillow"])


def test_the_default_backend_is_accepted_in_any_case() -> None:
    assert PyTorchConfiguration(communication_backend="NCCL", node_count=2).node_count == 2


@pytest.fixture
def submitted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict[str, Any]]:
    """What Experiment.submit sends to the apiserver (the snapshot stored nowhere)."""
    created: list[dict[str, Any]] = []
    monkeypatch.setattr(snapshots, "store", lambda *a, **k: "configmap/x created")
    monkeypatch.setattr(k8s, "create", lambda body, **k: created.append(body) or body)
    monkeypatch.setattr(k8s, "list_", lambda *a, **k: [CPU_NODE])  # the pool "cpu"
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    return created


def test_the_workspace_service_account_is_the_one_the_node_pods_run_as(
    submitted: list[dict[str, Any]],
) -> None:
    Experiment(ws(service_account="trainer"), "birds").submit(src(max_run_duration_seconds=600))
    [body] = submitted
    assert body["spec"]["serviceAccountName"] == "trainer"
    assert body["spec"]["policy"] == {"activeDeadlineSeconds": 600}


def test_without_a_service_account_the_run_names_none(submitted: list[dict[str, Any]]) -> None:
    Experiment(ws(), "birds").submit(src())
    [body] = submitted
    assert "serviceAccountName" not in body["spec"]  # the API's default: "default"


def test_config_json_with_an_unknown_key_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"namespace": NS, "serviceAcount": "trainer"})  # a typo
    )
    with pytest.raises(TorchyardSdkError, match=r"unknown key.*serviceAcount.*serviceAccount"):
        Workspace.from_config(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"namespace": NS, "serviceAccount": "t"}))
    assert Workspace.from_config(str(tmp_path)).service_account == "t"
    (tmp_path / "config.json").write_text(json.dumps(["namespace"]))
    with pytest.raises(TorchyardSdkError, match="not a JSON object"):
        Workspace.from_config(str(tmp_path))


def test_the_guides_mpi_configuration_submits_an_mpi_run(
    submitted: list[dict[str, Any]],
) -> None:
    mpi = MpiConfiguration(process_count_per_node=2, node_count=2)
    Experiment(ws(), "horovod").submit(src(distributed_job_config=mpi))
    [body] = submitted
    assert body["spec"]["distribution"] == {
        "type": "mpi",
        "nodeCount": 2,
        "processCountPerNode": 2,
    }
    assert body["spec"]["command"] == ["python", "train.py"]


def test_environment_get_finds_a_curated_environment_by_its_azure_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The guide's ``Environment.get(workspace=ws, name="AzureML-PyTorch-1.6-GPU")`` looks
    up the resource that name becomes (as ``register`` names it)."""
    asked: list[str] = []
    body = {"metadata": {"name": "azureml-pytorch-1-6-gpu"}, "spec": {"image": "r/pt:1"}}

    def get_or_none(kind: Any, namespace: str, name: str) -> dict[str, Any] | None:
        asked.append(name)
        return body if name == "azureml-pytorch-1-6-gpu" else None

    monkeypatch.setattr(k8s, "get_or_none", get_or_none)
    env = Environment.get(workspace=ws(), name="AzureML-PyTorch-1.6-GPU")
    assert (env.name, env.image) == ("azureml-pytorch-1-6-gpu", "r/pt:1")
    assert asked == ["azureml-pytorch-1-6-gpu"]
    monkeypatch.setattr(Workspace, "environments", property(lambda self: {}))
    with pytest.raises(TorchyardSdkError, match=r"no Environment 'AzureML-PyTorch-2' \(resource"):
        Environment.get(workspace=ws(), name="AzureML-PyTorch-2")
