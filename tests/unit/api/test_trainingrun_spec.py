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
        "outputs.register.path must be relative to the working directory and stay inside it",
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
