"""The TrainingRun model: defaults, and the same refusals as the CRD's CEL rules, so
local mode and the SDK reject what the apiserver would."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import TrainingRunBuilder
from torchyard import api


def test_defaults_follow_azure_ml() -> None:
    run = api.parse_trainingrun(TrainingRunBuilder("r").obj())
    dist = run.spec.distribution
    assert (dist.type, dist.node_count, dist.process_count_per_node) == ("pytorch", 1, 1)
    assert dist.launch == "process"
    assert dist.master_port == api.DEFAULT_MASTER_PORT == 6105
    assert run.spec.source.image is True
    assert run.spec.resources.gpus_per_node == 0
    assert run.spec.outputs.register_ is None


def test_node_pods_default_to_the_default_service_account_without_an_api_token() -> None:
    spec = api.parse_trainingrun(TrainingRunBuilder("r").obj()).spec
    assert spec.service_account_name == "default"
    assert spec.automount_service_account_token is False
    assert spec.outputs.optional is False
    assert spec.policy.platform_restart_limit == 20


def test_world_size_is_nodes_times_processes() -> None:
    run = api.parse_trainingrun(TrainingRunBuilder("r").nodes(2).procs(2).obj())
    assert run.spec.distribution.world_size == 4


def test_wire_form_round_trips_in_camel_case() -> None:
    body = TrainingRunBuilder("r").nodes(2).procs(2).gpus(2).register("birds").obj()
    spec = api.parse_trainingrun(body).spec.to_dict()
    assert spec["distribution"]["processCountPerNode"] == 2
    assert spec["resources"]["gpusPerNode"] == 2
    assert spec["outputs"]["register"]["model"] == "birds"


REFUSED: list[tuple[str, dict[str, Any], str]] = [
    (
        "more processes than GPUs",
        TrainingRunBuilder("r").procs(4).gpus(2).obj(),
        "processCountPerNode (4) must not exceed gpusPerNode (2)",
    ),
    ("zero nodes", TrainingRunBuilder("r").nodes(0).obj(), "spec.distribution.nodeCount"),
    (
        "privileged port",
        TrainingRunBuilder("r").master_port(80).obj(),
        "spec.distribution.masterPort",
    ),
    (
        "two sources",
        TrainingRunBuilder("r").source(image=True, configMap="x").obj(),
        "exactly one of source.configMap",
    ),
    (
        "rank contract variable",
        TrainingRunBuilder("r").env(RANK="3").obj(),
        "belongs to the rank contract",
    ),
    ("unknown field", TrainingRunBuilder("r").with_("spec.gpus", 2).obj(), "spec.gpus"),
    (
        "bad quantity",
        TrainingRunBuilder("r").with_("spec.resources.cpu", "8 cores").obj(),
        "spec.resources.cpu",
    ),
    (
        "negative memory",
        TrainingRunBuilder("r").with_("spec.resources.memory", "-1Gi").obj(),
        "spec.resources.memory",
    ),
    (
        "fractional exponent",
        TrainingRunBuilder("r").with_("spec.resources.memory", "1e1.5").obj(),
        "spec.resources.memory",
    ),
    (
        "oversize quantity",
        TrainingRunBuilder("r").with_("spec.resources.shmSize", "1" * 65).obj(),
        "spec.resources.shmSize",
    ),
    (
        "shm larger than memory",
        TrainingRunBuilder("r")
        .with_("spec.resources.memory", "8Gi")
        .with_("spec.resources.shmSize", "16Gi")
        .obj(),
        "resources.shmSize must not exceed resources.memory",
    ),
    (
        "shm larger than memory in other units",
        TrainingRunBuilder("r")
        .with_("spec.resources.memory", "1G")
        .with_("spec.resources.shmSize", "1Gi")
        .obj(),
        "got shmSize 1Gi > memory 1G",
    ),
    (
        "bad service account",
        TrainingRunBuilder("r").with_("spec.serviceAccountName", "Trainer_SA").obj(),
        "spec.serviceAccountName",
    ),
    (
        "empty service account",
        TrainingRunBuilder("r").with_("spec.serviceAccountName", "").obj(),
        "spec.serviceAccountName",
    ),
    (
        "negative platform restarts",
        TrainingRunBuilder("r").with_("spec.policy.platformRestartLimit", -1).obj(),
        "spec.policy.platformRestartLimit",
    ),
]

HOSTILE_REGISTER_PATHS = [
    "/etc/passwd",
    "/",
    "..",
    "../secrets",
    "outputs/../../etc",
    "outputs/..",
    "%2e%2e/x",
    "outputs/%2E%2e/x",
    ".%2e/x",
    "outputs\\..\\..\\x",
]
REFUSED += [
    (
        f"register path {path!r}",
        TrainingRunBuilder("r").register("m", path=path).obj(),
        "the path must be relative to the working directory and stay inside it",
    )
    for path in HOSTILE_REGISTER_PATHS
]
REFUSED.append(
    (
        "oversize register path",
        TrainingRunBuilder("r").register("m", path="a/" * 600).obj(),
        "spec.outputs.register.path",
    )
)

# What the apiserver used to accept and the node Pods then failed on, or ignored: each
# class with several bad values (the CRD's rules say the same: tests/integration/test_crds.py).
BAD_NODE_SELECTORS = [
    ({"gpu": "a b"}, "spec.compute.nodeSelector.gpu"),
    ({"gpu": "-a100"}, "spec.compute.nodeSelector.gpu"),
    ({"gpu": "a100_"}, "spec.compute.nodeSelector.gpu"),
    ({"gpu": "x" * 64}, "spec.compute.nodeSelector.gpu"),
    ({"zone": "eu/west"}, "spec.compute.nodeSelector.zone"),
    ({"bad key": "x"}, "every key must be a label key"),
    ({"-gpu": "x"}, "every key must be a label key"),
    ({"Example.com/gpu": "x"}, "every key must be a label key"),
    ({"a/b/c": "x"}, "every key must be a label key"),
    ({"example.com/" + "g" * 64: "x"}, "every key must be a label key"),
    ({"a" * 254 + "/gpu": "x"}, "every key must be a label key"),
    ({"": "x"}, "every key must be a label key"),
]
BAD_GIT_URLS = [
    "file:///srv/repo.git",
    "FILE:///srv/repo.git",
    "/srv/repo.git",
    "./repo",
    "ext::sh -c touch% /tmp/pwned",
    "ftp://example.com/repo.git",
    "https:///no-host",
    "git@:repo.git",
]
SMALL_MEMORY = ["1Ki", "0", "1", "1M", "31Mi", "33554431", "0.03Gi"]
NUL_FIELDS = [
    ("spec.command", ["python", "train.py", "--tag", "a\x00b"]),
    ("spec.command", ["\x00"]),
    ("spec.env", [{"name": "TAG", "value": "a\x00"}]),
    ("spec.distribution", {"type": "mpi", "mpirunArgs": ["--mca", "\x00"]}),
    ("spec.source", {"git": {"url": "https://git.example/x.git", "revision": "main\x00"}}),
]
REFUSED += [
    (
        f"nodeSelector {selector!r}",
        TrainingRunBuilder("r").with_("spec.compute.nodeSelector", selector).obj(),
        said,
    )
    for selector, said in BAD_NODE_SELECTORS
]
REFUSED += [
    (
        f"git url {url!r}",
        TrainingRunBuilder("r").source(git={"url": url}).obj(),
        "source.git.url must be an https://, http://, ssh:// or git:// URL",
    )
    for url in BAD_GIT_URLS
]
REFUSED += [
    (
        f"memory {memory}",
        TrainingRunBuilder("r").with_("spec.resources.memory", memory).obj(),
        "resources.memory must be at least 32Mi",
    )
    for memory in SMALL_MEMORY
]
REFUSED += [
    (
        f"NUL in {path} {value!r}",
        TrainingRunBuilder("r").with_(path, value).obj(),
        "must not contain a NUL byte",
    )
    for path, value in NUL_FIELDS
]
REFUSED += [
    (
        f"checkpoint size {size}",
        TrainingRunBuilder("r").with_("spec.checkpoints", {"size": size}).obj(),
        "checkpoints.size must be more than 0",
    )
    for size in ["0", "0Gi", "0.0"]
]


RACK = {"topology": {"level": "example.com/rack"}}
REFUSED += [
    (
        "a slice size that does not divide the gang",
        TrainingRunBuilder("r").nodes(6).with_("spec.placement", {**RACK, "sliceSize": 4}).obj(),
        "each in one domain of the level; got sliceSize 4 for 6 node(s)",
    ),
    (
        "slices of a preferred placement",
        TrainingRunBuilder("r")
        .nodes(4)
        .with_(
            "spec.placement", {"topology": {"level": "rack", "mode": "preferred"}, "sliceSize": 2}
        )
        .obj(),
        "placement.sliceSize needs placement.topology.mode required",
    ),
    (
        "a level that is no label key",
        TrainingRunBuilder("r").with_("spec.placement", {"topology": {"level": "a rack"}}).obj(),
        "placement.topology.level must be a node label key",
    ),
    (
        "a mode that is neither",
        TrainingRunBuilder("r")
        .with_("spec.placement", {"topology": {"level": "rack", "mode": "strict"}})
        .obj(),
        "spec.placement.topology.mode",
    ),
    (
        "a manager that is not MultiKueue",
        TrainingRunBuilder("r")
        .with_("spec.scheduling.queueName", "q")
        .with_("spec.managedBy", "example.com/other")
        .obj(),
        "managedBy: the only controller that may run a TrainingRun",
    ),
    (
        "MultiKueue without a queue",
        TrainingRunBuilder("r").with_("spec.managedBy", "kueue.x-k8s.io/multikueue").obj(),
        "needs spec.scheduling.queueName",
    ),
]


@pytest.mark.parametrize(("case", "body", "message"), REFUSED, ids=[c[0] for c in REFUSED])
def test_invalid_specs_are_refused_naming_the_field(
    case: str, body: dict[str, Any], message: str
) -> None:
    with pytest.raises(api.InvalidSpec) as err:
        api.parse_trainingrun(body)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "path", ["outputs", "outputs/model.pt", "outputs/model..pt", "outputs/..hidden", "./outputs"]
)
def test_register_paths_inside_the_working_directory_are_accepted(path: str) -> None:
    run = api.parse_trainingrun(TrainingRunBuilder("r").register("m", path=path).obj())
    assert run.spec.outputs.register_ is not None and run.spec.outputs.register_.path == path


@pytest.mark.parametrize(
    ("memory", "shm"), [("16Gi", "16Gi"), ("16Gi", "8Gi"), ("1Gi", "1G"), ("64Gi", None)]
)
def test_shm_up_to_memory_is_accepted(memory: str, shm: str | None) -> None:
    builder = TrainingRunBuilder("r").with_("spec.resources.memory", memory)
    if shm is not None:
        builder.with_("spec.resources.shmSize", shm)
    assert api.parse_trainingrun(builder.obj()).spec.resources.memory == memory


def test_environment_needs_image_xor_base_image() -> None:
    ok = api.parse_environment(
        {"kind": "Environment", "metadata": {"name": "e"}, "spec": {"image": "python:3.11"}}
    )
    assert ok.spec.image == "python:3.11"
    with pytest.raises(api.InvalidSpec, match="exactly one of image"):
        api.parse_environment(
            {
                "kind": "Environment",
                "metadata": {"name": "e"},
                "spec": {"image": "a", "baseImage": "b"},
            }
        )


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("spec.compute.nodeSelector", {"gpu": "a100", "empty": ""}),
        ("spec.compute.nodeSelector", {"topology.kubernetes.io/zone": "eu-west-1a"}),
        ("spec.compute.nodeSelector", {"example.com/" + "g" * 63: "x" * 63}),
        ("spec.compute.nodeSelector", {"A_b.c": "D-e_f.g"}),
        ("spec.source", {"git": {"url": "https://github.com/org/repo.git"}}),
        ("spec.source", {"git": {"url": "http://git.local:3000/org/repo"}}),
        ("spec.source", {"git": {"url": "ssh://git@git.example/org/repo.git"}}),
        ("spec.source", {"git": {"url": "git://git.example/repo"}}),
        ("spec.source", {"git": {"url": "git@github.com:org/repo.git"}}),
        ("spec.resources.memory", "32Mi"),
        ("spec.resources.memory", "33554432"),
        ("spec.resources.memory", "0.5Gi"),
        ("spec.command", ["python", "-c", "print('\\x00 as text is fine')"]),
        ("spec.checkpoints", {"size": "1Mi"}),
        ("spec.placement", {"topology": {"level": "kubernetes.io/hostname"}}),
        ("spec.placement", {"topology": {"level": "rack", "mode": "preferred"}}),
        ("spec.placement", {"topology": {"level": "example.com/rack"}, "sliceSize": 1}),
    ],
)
def test_values_on_the_edge_of_the_rules_are_accepted(path: str, value: Any) -> None:
    run = api.parse_trainingrun(TrainingRunBuilder("r").with_(path, value).obj())
    wire: Any = run.to_dict()
    for key in path.split("."):
        wire = wire[key]
    assert _written(wire, value)


def _written(wire: Any, value: Any) -> bool:
    """``value`` is in ``wire`` (which may hold defaults beside it)."""
    if isinstance(value, dict):
        return isinstance(wire, dict) and all(_written(wire.get(k), v) for k, v in value.items())
    return bool(wire == value)
