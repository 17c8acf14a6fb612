"""The CRDs on a real apiserver: kubectl explain, the torchyard category, printer
columns, and CEL rules that refuse bad resources with a message naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import TrainingRunBuilder, environment, model_version
from tests.cluster.harness import Cluster
from tests.integration.helpers import refused_by_both
from torchyard import api, k8s


def test_kubectl_explain_describes_every_distribution_field(cluster: Cluster) -> None:
    out = cluster.kubectl("explain", "trainingrun.spec.distribution")
    assert "PyTorchConfiguration" in out
    for field in ("nodeCount", "processCountPerNode", "launch", "masterPort", "type"):
        assert field in out
    assert "1024-65535" in out
    env_out = cluster.kubectl("explain", "environment.spec.baseImage")
    assert "Image to build on" in env_out


def test_kubectl_explain_describes_the_node_pods_identity_and_shm(cluster: Cluster) -> None:
    shm = " ".join(cluster.kubectl("explain", "trainingrun.spec.resources.shmSize").split())
    assert "Default: half of memory, else 1Gi. At most memory." in shm
    sa = " ".join(cluster.kubectl("explain", "trainingrun.spec.serviceAccountName").split())
    assert "ServiceAccount (in the run's namespace) the node Pods run as" in sa
    token = cluster.kubectl("explain", "trainingrun.spec.automountServiceAccountToken")
    assert "registry token" in " ".join(token.split())
    limit = cluster.kubectl("explain", "trainingrun.spec.policy.platformRestartLimit")
    assert "0: the first one fails the run" in " ".join(limit.split())


def test_kubectl_get_torchyard_lists_all_three_kinds(cluster: Cluster, namespace: str) -> None:
    k8s.create(environment("pytorch", namespace))
    k8s.create(TrainingRunBuilder("birds", namespace).obj())
    k8s.create(model_version("birds-v1", namespace, "birds", 1))
    out = cluster.kubectl("get", "torchyard", "-n", namespace)
    assert "environment.torchyard.dev/pytorch" in out
    assert "trainingrun.torchyard.dev/birds" in out
    assert "modelversion.torchyard.dev/birds-v1" in out


def test_short_names_and_printer_columns(cluster: Cluster, namespace: str) -> None:
    k8s.create(TrainingRunBuilder("bert", namespace).nodes(2).procs(4).gpus(4).obj())
    k8s.create(model_version("bert-v7", namespace, "bert", 7))
    k8s.create(environment("pytorch", namespace))
    tr = cluster.kubectl("get", "tr", "-n", namespace)
    assert tr.split("\n")[0].split() == [
        "NAME",
        "PHASE",
        "NODES",
        "PROCESSES",
        "QUEUE",
        "MODEL",
        "VERSION",
        "STEP",  # status.progress: step, percent, ETA
        "PERCENT",
        "ETA",
        "AGE",
    ]
    mv = cluster.kubectl("get", "mv", "-n", namespace)
    assert mv.split("\n")[0].split() == ["NAME", "MODEL", "VERSION", "RUN", "SIZE", "AGE"]
    row = mv.split("\n")[1].split()
    assert row[:5] == ["bert-v7", "bert", "7", "some-run", "3"]
    env = cluster.kubectl("get", "env", "-n", namespace, "-o", "wide")
    assert env.split("\n")[0].split() == ["NAME", "PHASE", "IMAGE", "HASH", "AGE"]


def test_defaults_are_applied_by_the_apiserver(cluster: Cluster, namespace: str) -> None:
    created = k8s.create(TrainingRunBuilder("defaults", namespace).obj())
    dist = created["spec"]["distribution"]
    assert dist == {
        "type": "pytorch",
        "nodeCount": 1,
        "processCountPerNode": 1,
        "launch": "process",
        "masterPort": 6105,
    }
    assert created["spec"]["resources"]["gpusPerNode"] == 0
    assert created["spec"]["policy"] == {
        "backoffLimit": 0,
        "platformRestartLimit": 20,
        "terminationGracePeriodSeconds": 30,
    }
    assert created["spec"]["serviceAccountName"] == "default"
    assert created["spec"]["automountServiceAccountToken"] is False
    assert created["spec"]["outputs"] == {"optional": False}


REJECTED: list[tuple[str, dict[str, Any], str]] = [
    (
        "more processes than GPUs",
        TrainingRunBuilder("r").procs(4).gpus(2).obj(),
        "processCountPerNode must not exceed resources.gpusPerNode",
    ),
    ("zero nodes", TrainingRunBuilder("r").nodes(0).obj(), "spec.distribution.nodeCount"),
    (
        "zero processes",
        TrainingRunBuilder("r").procs(0).obj(),
        "spec.distribution.processCountPerNode",
    ),
    (
        "privileged master port",
        TrainingRunBuilder("r").master_port(80).obj(),
        "spec.distribution.masterPort",
    ),
    (
        "two sources",
        TrainingRunBuilder("r").source(image=True, configMap="src").obj(),
        "exactly one of source.configMap, source.snapshot, source.git or source.image",
    ),
    (
        "no source kind",
        TrainingRunBuilder("r").source().obj(),
        "exactly one of source.configMap, source.snapshot, source.git or source.image",
    ),
    ("empty command", TrainingRunBuilder("r").command().obj(), "spec.command"),
    (
        "missing environment",
        TrainingRunBuilder("r").with_("spec.environment", "").obj(),
        "spec.environment",
    ),
    (
        "overriding the rank contract",
        TrainingRunBuilder("r").env(MASTER_ADDR="x").obj(),
        "belongs to the rank contract",
    ),
    (
        "single-process type with two nodes",
        TrainingRunBuilder("r").with_("spec.distribution.type", "none").nodes(2).obj(),
        "distribution.type 'none' runs one process",
    ),
    (
        "unknown launch mode",
        TrainingRunBuilder("r").launch("mpirun").obj(),
        "spec.distribution.launch",
    ),
    (
        "bad quantity",
        TrainingRunBuilder("r").with_("spec.resources.memory", "lots").obj(),
        "spec.resources.memory",
    ),
    ("name too long for its Pods", TrainingRunBuilder("r" * 60).obj(), "at most 52 characters"),
    (
        "shm larger than memory",
        TrainingRunBuilder("r")
        .with_("spec.resources.memory", "8Gi")
        .with_("spec.resources.shmSize", "16Gi")
        .obj(),
        "spec.resources.shmSize: Invalid value",
    ),
    (
        "shm larger than memory in other units",
        TrainingRunBuilder("r")
        .with_("spec.resources.memory", "1G")
        .with_("spec.resources.shmSize", "1Gi")
        .obj(),
        "resources.shmSize must not exceed resources.memory",
    ),
    (
        "negative shm",
        TrainingRunBuilder("r").with_("spec.resources.shmSize", "-1Gi").obj(),
        "spec.resources.shmSize",
    ),
    (
        "oversize quantity",
        TrainingRunBuilder("r").with_("spec.resources.memory", "9" * 65).obj(),
        "spec.resources.memory",
    ),
    (
        "bad service account name",
        TrainingRunBuilder("r").with_("spec.serviceAccountName", "Trainer_SA").obj(),
        "spec.serviceAccountName",
    ),
    (
        "negative platform restart limit",
        TrainingRunBuilder("r").with_("spec.policy.platformRestartLimit", -1).obj(),
        "spec.policy.platformRestartLimit",
    ),
    (
        "oversize register path",
        TrainingRunBuilder("r").register("m", path="a/" * 600).obj(),
        "spec.outputs.register.path",
    ),
]
REGISTER_PATH_RULE = (
    "spec.outputs.register.path: Invalid value: the path must be "
    "relative to the working directory and stay inside it"
)
REJECTED += [
    (f"register path {path!r}", TrainingRunBuilder("r").register("m", path=path).obj(), rule)
    for path, rule in [
        ("/etc/passwd", REGISTER_PATH_RULE),
        ("../secrets", REGISTER_PATH_RULE),
        ("outputs/../../etc", REGISTER_PATH_RULE),
        ("outputs/..", REGISTER_PATH_RULE),
        ("%2e%2e/x", REGISTER_PATH_RULE),
        ("outputs/%2E%2e/x", REGISTER_PATH_RULE),
        ("outputs\\..\\..\\x", REGISTER_PATH_RULE),
    ]
]


@pytest.mark.parametrize(("case", "body", "message"), REJECTED, ids=[c[0] for c in REJECTED])
def test_invalid_trainingrun_is_refused_naming_the_field(
    cluster: Cluster, namespace: str, case: str, body: dict[str, Any], message: str
) -> None:
    refused_by_both(namespace, body, message)


ACCEPTED: list[tuple[str, dict[str, Any]]] = [
    (
        "shm equal to memory",
        TrainingRunBuilder("r")
        .with_("spec.resources.memory", "16Gi")
        .with_("spec.resources.shmSize", "16Gi")
        .obj(),
    ),
    (
        "shm smaller in other units",
        TrainingRunBuilder("r")
        .with_("spec.resources.memory", "1Gi")
        .with_("spec.resources.shmSize", "1G")
        .obj(),
    ),
    ("shm without memory", TrainingRunBuilder("r").with_("spec.resources.shmSize", "4Gi").obj()),
    ("dots inside a name", TrainingRunBuilder("r").register("m", path="outputs/model..pt").obj()),
    (
        "a service account",
        TrainingRunBuilder("r").with_("spec.serviceAccountName", "trainer").obj(),
    ),
]


@pytest.mark.parametrize(("case", "body"), ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_valid_trainingrun_is_accepted_by_the_apiserver_and_the_models(
    cluster: Cluster, namespace: str, case: str, body: dict[str, Any]
) -> None:
    body["metadata"]["namespace"] = namespace
    api.parse_trainingrun(body)
    k8s.create(body)


ENV_REJECTED = [
    (
        "image and baseImage",
        {"image": "a", "baseImage": "b", "registry": {"repository": "r"}},
        "set exactly one of image (a prebuilt image), baseImage (build on it) or dockerfile",
    ),
    (
        "pip with a dockerfile",
        {"dockerfile": "FROM x", "pip": ["torch"], "registry": {"repository": "r"}},
        "pip, conda and env need baseImage",
    ),
    ("neither", {"pip": ["torch"]}, "set exactly one of image"),
    (
        "pip on a prebuilt image",
        {"image": "a", "pip": ["torch"]},
        "pip, conda and env need baseImage",
    ),
    ("build without registry", {"baseImage": "python:3.11"}, "needs registry.repository"),
    (
        "pip index on a prebuilt image",
        {"image": "a", "pipIndexUrl": "http://mirror/simple"},
        "pipIndexUrl needs baseImage",
    ),
    (
        "pip index that is no http(s) URL",
        {"baseImage": "b", "pipIndexUrl": "file:///etc", "registry": {"repository": "r"}},
        "spec.pipIndexUrl",
    ),
]


@pytest.mark.parametrize(
    ("case", "spec", "message"), ENV_REJECTED, ids=[c[0] for c in ENV_REJECTED]
)
def test_invalid_environment_is_refused(
    cluster: Cluster, namespace: str, case: str, spec: dict[str, Any], message: str
) -> None:
    with pytest.raises(k8s.ApiError) as err:
        k8s.create(environment("env", namespace, **spec))
    assert err.value.invalid
    assert message in err.value.message


def test_distribution_is_immutable(cluster: Cluster, namespace: str) -> None:
    k8s.create(TrainingRunBuilder("fixed", namespace).nodes(2).obj())
    out = cluster.kubectl(
        "patch",
        "tr",
        "fixed",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"distribution":{"nodeCount":3}}}',
        check=False,
    )
    assert "distribution is immutable" in out
    # Other fields may change.
    cluster.kubectl(
        "patch",
        "tr",
        "fixed",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"command":["python","other.py"]}}',
    )


def test_model_version_is_immutable(cluster: Cluster, namespace: str) -> None:
    k8s.create(model_version("m-v1", namespace, "m", 1))
    out = cluster.kubectl(
        "patch",
        "mv",
        "m-v1",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"version":2}}',
        check=False,
    )
    assert "a ModelVersion is immutable" in out
