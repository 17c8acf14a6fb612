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
]


@pytest.mark.parametrize(("case", "body", "message"), REFUSED, ids=[c[0] for c in REFUSED])
def test_invalid_specs_are_refused_naming_the_field(
    case: str, body: dict[str, Any], message: str
) -> None:
    with pytest.raises(api.InvalidSpec) as err:
        api.parse_trainingrun(body)
    assert message in str(err.value)


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
