"""``spec.inputs`` on a real apiserver: the CEL rules refuse every kind of bad input with
a message naming the field, the Python models refuse the same (local mode and the SDK
parse with them), and good inputs of every scheme are accepted by both."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import TrainingRunBuilder
from tests.cluster.harness import Cluster
from tests.integration.helpers import refused_by_both
from torchyard import api, k8s

SHA = "0" * 64


def run_with(*inputs: dict[str, Any]) -> dict[str, Any]:
    return TrainingRunBuilder("r").with_("spec.inputs", list(inputs)).obj()


def web(**extra: Any) -> dict[str, Any]:
    return {"name": "birds", "uri": "https://example.org/birds.tgz", "sha256": SHA, **extra}


REJECTED: list[tuple[str, dict[str, Any], str]] = [
    ("unknown scheme", run_with({"name": "a", "uri": "gs://bucket/x"}), "uri must be"),
    ("s3 upper-case bucket", run_with({"name": "a", "uri": "s3://Birds/x"}), "uri must be"),
    ("s3 short bucket", run_with({"name": "a", "uri": "s3://ab"}), "uri must be"),
    ("s3 with a host", run_with({"name": "a", "uri": "s3://user@birds/x"}), "uri must be"),
    ("secret on https", run_with(web(secretRef="store")), "secretRef is for s3"),
    ("secret on a model", run_with({"name": "a", "uri": "model://b/1", "secretRef": "s"}), "s3"),
    ("hf absolute", run_with({"name": "a", "uri": "hf:///etc/passwd"}), "uri must be"),
    ("hf parent repo", run_with({"name": "a", "uri": "hf://acme/../etc"}), "uri must be"),
    ("hf three parts", run_with({"name": "a", "uri": "hf://acme/tiny/x"}), "uri must be"),
    ("hf encoded repo", run_with({"name": "a", "uri": "hf://acme/%2e%2e"}), "uri must be"),
    ("hf double dash", run_with({"name": "a", "uri": "hf://acme/ti--ny"}), "an hf:// uri"),
    ("hf parent revision", run_with({"name": "a", "uri": "hf://a/b@main/../x"}), "an hf:// uri"),
    ("hf dot revision", run_with({"name": "a", "uri": "hf://a/b@refs/.x"}), "an hf:// uri"),
    ("hf empty segment", run_with({"name": "a", "uri": "hf://a/b@refs//x"}), "an hf:// uri"),
    ("hf lock revision", run_with({"name": "a", "uri": "hf://a/b@x.lock"}), "an hf:// uri"),
    ("hf encoded revision", run_with({"name": "a", "uri": "hf://a/b@%2e%2e"}), "uri must be"),
    ("hf sha256", run_with({"name": "a", "uri": "hf://a/b", "sha256": SHA}), "sha256"),
    ("hf revision field", run_with({"name": "a", "uri": "hf://a/b", "revision": "3"}), "revision"),
    *[
        (f"s3 prefix {what}", run_with({"name": "a", "uri": uri}), "an s3:// prefix may not")
        for what, uri in [
            ("parent", "s3://birds/a/../b"),
            ("ending in a parent", "s3://birds/a/.."),
            ("encoded parent", "s3://birds/a/%2E%2e/b"),
            ("half-encoded parent", "s3://birds/.%2e/b"),
            ("dot segment", "s3://birds/./a"),
            ("absolute", "s3://birds//etc/passwd"),
            ("empty segment", "s3://birds/a//b"),
            ("backslash", "s3://birds/a\\b"),
            ("encoded backslash", "s3://birds/a%5C..%5Cb"),
            ("encoded NUL", "s3://birds/a%00b"),
            ("control character", "s3://birds/a\x01b"),
        ]
    ],
    ("s3 no bucket", run_with({"name": "a", "uri": "s3:///etc/passwd"}), "uri must be"),
    ("s3 oversize uri", run_with({"name": "a", "uri": "s3://birds/" + "p" * 2040}), "uri"),
    (
        "secret not a name",
        run_with({"name": "a", "uri": "s3://birds", "secretRef": "../x"}),
        "spec.inputs[0].secretRef",
    ),
    ("file scheme", run_with({"name": "a", "uri": "file:///etc/passwd"}), "uri must be"),
    ("a bare path", run_with({"name": "a", "uri": "/data"}), "uri must be"),
    ("https without sha256", run_with({"name": "a", "uri": "https://h/x"}), "sha256 is required"),
    ("sha256 on a claim", run_with({"name": "a", "uri": "pvc://d", "sha256": SHA}), "sha256"),
    ("short sha256", run_with(web(sha256="abc")), "spec.inputs[0].sha256"),
    ("revision on https", run_with(web(revision="3")), "revision is a model"),
    (
        "revision and version",
        run_with({"name": "a", "uri": "model://birds/2", "revision": "3"}),
        "revision is a model",
    ),
    ("upper-case name", run_with(web(name="Birds")), "spec.inputs[0].name"),
    ("name with a dash", run_with(web(name="my-birds")), "spec.inputs[0].name"),
    ("unknown mode", run_with(web(mode="stream")), "spec.inputs[0].mode"),
    ("relative path", run_with(web(path="data/birds")), "path must be an absolute folder"),
    ("root path", run_with(web(path="/")), "path must be an absolute folder"),
    ("parent in path", run_with(web(path="/data/../etc")), "path must be an absolute folder"),
    ("encoded parent", run_with(web(path="/data/%2e%2e/x")), "path must be an absolute folder"),
    ("dot segment", run_with(web(path="/data/./x")), "path must be an absolute folder"),
    ("double slash", run_with(web(path="/data//x")), "path must be an absolute folder"),
    ("over /dev", run_with(web(path="/dev/shm")), "path must be an absolute folder"),
    ("over /etc", run_with(web(path="/etc")), "path must be an absolute folder"),
    ("over the launcher", run_with(web(path="/torchyard/lib/x")), "path must be"),
    ("over the tokens", run_with(web(path="/var/run/secrets")), "path must be"),
    ("absolute pattern", run_with(web(include=["/etc/*"])), "patterns are relative"),
    ("absolute exclude", run_with(web(exclude=["/x"])), "patterns are relative"),
    ("empty pattern", run_with(web(include=[""])), "spec.inputs[0].include[0]"),
    (
        "two inputs one path",
        run_with(web(), web(name="other", path="/torchyard/inputs/birds")),
        "two inputs may not share a path",
    ),
    ("two inputs one name", run_with(web(), web(path="/x")), "spec.inputs[1]"),
]


@pytest.mark.parametrize(("case", "body", "message"), REJECTED, ids=[c[0] for c in REJECTED])
def test_a_bad_input_is_refused_naming_the_field(
    cluster: Cluster, namespace: str, case: str, body: dict[str, Any], message: str
) -> None:
    refused_by_both(namespace, body, message)


ACCEPTED = [
    ("https archive", run_with(web(include=["*.jpg"], exclude=["test/*"]))),
    ("http file", run_with(web(uri="http://files.svc:8080/x.bin"))),
    ("model version", run_with({"name": "base", "uri": "model://birds/3", "mode": "download"})),
    ("model revision", run_with({"name": "base", "uri": "model://birds", "revision": "3"})),
    ("model latest", run_with({"name": "base", "uri": "model://birds"})),
    ("claim", run_with({"name": "data", "uri": "pvc://datasets/birds", "path": "/data"})),
    ("several", run_with(web(), {"name": "data", "uri": "pvc://datasets"})),
    ("s3 prefix", run_with({"name": "shots", "uri": "s3://birds/train", "secretRef": "store"})),
    ("s3 public bucket", run_with({"name": "shots", "uri": "s3://open.data-1"})),
    ("hf model", run_with({"name": "base", "uri": "hf://acme/tiny", "include": ["*.json"]})),
    ("hf pinned", run_with({"name": "base", "uri": "hf://acme/tiny@" + "a" * 40})),
    ("hf refs", run_with({"name": "base", "uri": "hf://Acme-AI/tiny_v2.1@refs/pr/1"})),
    (
        "hf data set",
        run_with({"name": "d", "uri": "hf://datasets/acme/birds@v1", "secretRef": "h"}),
    ),
]


@pytest.mark.parametrize(("case", "body"), ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_good_inputs_are_accepted_by_the_apiserver_and_the_models(
    cluster: Cluster, namespace: str, case: str, body: dict[str, Any]
) -> None:
    body["metadata"]["namespace"] = namespace
    api.parse_trainingrun(body)
    k8s.create(body)
