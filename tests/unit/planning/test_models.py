"""One metadata for every registration (``planning.models.promote_metadata``): the
operator's finalize step, the SDK's ``register_model`` and local mode record the same run,
and differ only in the rows of this table. Every key is one the registry accepts."""

from __future__ import annotations

import typing
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder
from torchyard import api
from torchyard.planning import models
from torchyard.registry import store

RUN = api.parse_trainingrun(
    TrainingRunBuilder("birds", "team")
    .nodes(2)
    .procs(4)
    .command("python", "train.py", "--epochs", "3")
    .with_("metadata.uid", "uid-1")
    .register("birds")
    .obj()
)
IMAGE = "reg.local/envs@sha256:" + "a" * 64
# Who registers -> (what it passes, what it adds to the common part).
CALLERS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "operator (controller.finalize)": (
        {"image": IMAGE},
        {"environmentImage": IMAGE},
    ),
    "SDK register_model": (
        {
            "image": IMAGE,
            "tags": {"stage": "dev"},
            "properties": {"accuracy": 0.9},
            "description": "first",
            "framework": models.Framework(name="PyTorch", version="1.13"),
        },
        {
            "environmentImage": IMAGE,
            "tags": {"stage": "dev"},
            "properties": {"accuracy": 0.9},
            "description": "first",
            "framework": {"name": "PyTorch", "version": "1.13"},
        },
    ),
    "SDK register_model, nothing extra": (
        {"image": IMAGE, "tags": {}, "properties": {}, "description": ""},
        {"environmentImage": IMAGE, "tags": {}, "properties": {}, "description": ""},
    ),
    "local mode, curated Environment": (
        {"image": "python:3.11-slim", "metrics": {"loss": 0.5}, "local": True},
        {"environmentImage": "python:3.11-slim", "metrics": {"loss": 0.5}, "mode": "local"},
    ),
    "local mode, no Environment image": (
        {"metrics": {}, "local": True},
        {"metrics": {}, "mode": "local"},
    ),
}
COMMON = {
    "run": {"name": "birds", "namespace": "team", "uid": "uid-1"},
    "environment": "pytorch",
    "command": ["python", "train.py", "--epochs", "3"],
    "nodeCount": 2,
    "processCountPerNode": 4,
}


@pytest.mark.parametrize("caller", sorted(CALLERS))
def test_every_registration_records_the_same_run_and_only_its_own_extras(caller: str) -> None:
    given, extras = CALLERS[caller]
    meta = models.promote_metadata(RUN, **given)
    assert dict(meta) == {**COMMON, **extras}
    store.check_metadata(meta)  # what the registry service and the local store accept
    assert set(meta) <= store.METADATA_KEYS
    assert set(meta) <= set(typing.get_type_hints(models.PromoteMetadata))


def test_the_typed_record_names_only_keys_the_registry_accepts() -> None:
    assert set(typing.get_type_hints(models.PromoteMetadata)) <= store.METADATA_KEYS


def test_the_model_version_and_its_status_manifest() -> None:
    manifest = {"version": 3, "files": [{"path": "model.pt"}], "totalBytes": 5, "size": "5 B"}
    mv = models.model_version(
        "team", "birds", manifest, run="birds", run_uid="uid-1", command=["python"], image=IMAGE
    )
    assert mv["metadata"]["name"] == "birds-v3"
    assert mv["spec"]["environmentImage"] == IMAGE
    assert mv["spec"]["storagePath"] == "team/models/birds/3"
    st = models.model_version_status("team", "birds-v3", {"phase": "Available"})
    assert st == {
        "apiVersion": api.API_VERSION,
        "kind": "ModelVersion",
        "metadata": {"name": "birds-v3", "namespace": "team"},
        "status": {"phase": "Available"},
    }
