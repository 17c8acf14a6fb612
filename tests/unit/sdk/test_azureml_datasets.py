"""Azure ML's file datasets as inputs: the guide's tip
(``Dataset.File.from_files(...)``, ``dataset.as_named_input('birds').as_mount()`` among
the arguments) submits a TrainingRun with ``spec.inputs`` and the argument
``$TORCHYARD_INPUT_BIRDS``; what has no counterpart raises with what to write instead;
``Run.get_context().input_datasets`` gives the script each input's folder."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.unit.sdk.test_azureml_arguments import src, submitted, ws  # noqa: F401
from torchyard import api
from torchyard.sdk import Dataset, Datastore, Experiment, Run, TorchyardSdkError

SHA = "ab" * 32


def test_a_named_mount_among_the_arguments_becomes_an_input(
    submitted: list[dict[str, Any]],  # noqa: F811
) -> None:
    birds = Dataset.File.from_files("https://files.example/birds.tgz", sha256=SHA)
    base = Dataset.File.from_files(["model://birds/3"], include=["*.pt"])
    config = src(
        arguments=[
            "--data-folder",
            birds.as_named_input("birds").as_mount(),
            "--init",
            base.as_named_input("base").as_download("/models/base"),
        ]
    )
    Experiment(ws(), "birds").submit(config)
    [body] = submitted
    assert body["spec"]["command"][-4:] == [
        "--data-folder",
        "$TORCHYARD_INPUT_BIRDS",
        "--init",
        "$TORCHYARD_INPUT_BASE",
    ]
    assert body["spec"]["inputs"] == [
        {"name": "birds", "uri": "https://files.example/birds.tgz", "mode": "mount", "sha256": SHA},
        {
            "name": "base",
            "uri": "model://birds/3",
            "mode": "download",
            "path": "/models/base",
            "include": ["*.pt"],
        },
    ]
    api.parse_trainingrun(body)  # what the apiserver gets is a valid run


def test_a_path_on_a_datastore_is_an_s3_input_read_with_its_secret(
    submitted: list[dict[str, Any]],  # noqa: F811
) -> None:
    workspace = ws()
    Datastore.register_s3(workspace, "birds_store", bucket_name="birds", secret_name="birds-s3")
    store = Datastore.get(workspace, "birds_store")
    assert workspace.datastores == {"birds_store": store}
    birds = Dataset.File.from_files(path=(store, "birds/"), include=["*.jpg"])
    shots = Dataset.File.from_files(path=[(store, "shots/2026")])
    arguments = [birds.as_named_input("birds").as_mount(), shots.as_named_input("s").as_download()]
    Experiment(workspace, "birds").submit(src(arguments=arguments))
    [body] = submitted
    assert body["spec"]["inputs"] == [
        {
            "name": "birds",
            "uri": "s3://birds/birds",
            "mode": "mount",
            "include": ["*.jpg"],
            "secretRef": "birds-s3",
        },
        {"name": "s", "uri": "s3://birds/shots/2026", "mode": "download", "secretRef": "birds-s3"},
    ]
    api.parse_trainingrun(body)


@pytest.mark.parametrize(
    ("bucket", "secret", "path", "says"),
    [
        ("Birds", "birds-s3", "x", "is not an s3 input"),
        ("birds", "../x", "x", "is not a Secret's name"),
        ("birds", "Birds_S3", "x", "is not a Secret's name"),
        ("birds", "birds-s3", "/etc/passwd", "without a leading '/'"),
        ("birds", "birds-s3", "../other", "'..'"),
        ("birds", "birds-s3", "a/%2e%2e/b", "'..'"),
        ("birds", "birds-s3", "a//b", "empty segment"),
        ("birds", "birds-s3", "a\\b", "backslash"),
        ("birds", "birds-s3", "a/./b", "'.'"),
    ],
)
def test_a_datastore_refuses_buckets_secrets_and_paths_that_leave_it(
    bucket: str, secret: str, path: str, says: str
) -> None:
    with pytest.raises(TorchyardSdkError, match=re.escape(says)):
        store = Datastore.register_s3(ws(), "d", bucket_name=bucket, secret_name=secret)
        Dataset.File.from_files((store, path))


def test_a_datastore_path_takes_no_sha256() -> None:
    store = Datastore.register_s3(ws(), "d", bucket_name="birds", secret_name="birds-s3")
    dataset = Dataset.File.from_files((store, "birds/"), sha256="ab" * 32)
    with pytest.raises(TorchyardSdkError, match="sha256 is for https:// inputs only"):
        dataset.as_named_input("birds").as_mount()


REFUSED: list[tuple[str, Callable[[], Any], str]] = [
    (
        "not a datastore",
        lambda: Dataset.File.from_files((object(), "birds/")),
        "(datastore, path) takes a Datastore of Datastore.register_s3",
    ),
    (
        "an Azure blob container",
        lambda: Datastore.register_azure_blob_container(ws(), "d", "c", "account"),
        "register an S3-compatible store instead: Datastore.register_s3",
    ),
    ("an unregistered datastore", lambda: Datastore.get(ws(), "nothing"), "no datastore"),
    ("two paths", lambda: Dataset.File.from_files(["a", "b"]), "one URI"),
    (
        "validate=False",
        lambda: Dataset.File.from_files("model://b/1", validate=False),
        "validate=False has no meaning",
    ),
    (
        "partition_format",
        lambda: Dataset.File.from_files("model://b/1", partition_format="{x}"),
        "partition_format and is_file",
    ),
    (
        "an unnamed mount",
        lambda: Dataset.File.from_files("model://b/1").as_mount(),
        "as_named_input('birds')",
    ),
    (
        "an https file without sha256",
        lambda: Dataset.File.from_files("https://h/x.tgz").as_named_input("x").as_mount(),
        "needs sha256",
    ),
    (
        "an unknown scheme",
        lambda: Dataset.File.from_files("gs://b/k").as_named_input("x").as_mount(),
        "unknown scheme gs://",
    ),
    (
        "a name that is no variable",
        lambda: Dataset.File.from_files("model://b/1").as_named_input("My-Birds").as_mount(),
        "input 'My-Birds'",
    ),
    (
        "a system path",
        lambda: Dataset.File.from_files("model://b/1").as_named_input("b").as_mount("/etc"),
        "path must be an absolute folder",
    ),
]


@pytest.mark.parametrize(("case", "call", "says"), REFUSED, ids=[c[0] for c in REFUSED])
def test_what_has_no_counterpart_raises_with_advice(
    case: str, call: Callable[[], Any], says: str
) -> None:
    with pytest.raises(TorchyardSdkError) as err:
        call()
    assert says in str(err.value)


def test_the_script_finds_its_inputs_folders(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHYARD_INPUT_BIRDS", "/torchyard/inputs/birds")
    monkeypatch.setenv("TORCHYARD_INPUTS_COPIES", "[]")
    assert Run.get_context().input_datasets == {"birds": "/torchyard/inputs/birds"}


def test_the_guide_passes_a_path_it_can_open(tmp_path: Path) -> None:
    arg = Dataset.File.from_files("pvc://datasets/birds").as_named_input("birds").as_mount()
    assert isinstance(arg, str) and arg == "$TORCHYARD_INPUT_BIRDS"
    assert arg.input.mount_path == "/torchyard/inputs/birds"
