"""What an input's URI may be: the schemes the fetcher takes, each refused with a message
that says how to write it, and the claim subpaths that could leave the claim."""

from __future__ import annotations

import pytest

from torchyard.inputs import uris
from torchyard.inputs.uris import InputError

SHA = "a" * 64

GOOD = [
    ("https://example.org/birds.tar.gz", SHA, "https"),
    ("http://files.team.svc:8080/b.zip", SHA, "http"),
    ("model://birds/3", "", "model"),
    ("model://my-model/12", "", "model"),
    ("pvc://datasets", "", "pvc"),
    ("pvc://datasets/birds/2024", "", "pvc"),
]


@pytest.mark.parametrize(("uri", "sha256", "scheme"), GOOD)
def test_a_good_uri_gives_its_scheme(uri: str, sha256: str, scheme: str) -> None:
    assert uris.parse(uri, sha256) == scheme


BAD = [
    ("gs://bucket/key", "", "unknown scheme gs://"),
    ("ftp://host/x", "", "unknown scheme ftp://"),
    ("file:///etc/passwd", "", "unknown scheme file://"),
    ("/data/birds", "", r"unknown scheme \(none\)"),
    ("https://example.org/x.tgz", "", "needs sha256"),
    ("https://example.org/x.tgz", "ABC", "needs sha256"),
    ("https://user:pw@example.org/x.tgz", SHA, "holds credentials"),
    ("https:///x.tgz", SHA, "names no host"),
    ("https://example.org/a b.tgz", SHA, "white space"),
    ("https://example.org/a\x00.tgz", SHA, "NUL"),
    ("model://birds/latest", "", r"model://<model>\[/<version>\]"),
    ("model://birds/0", "", r"model://<model>\[/<version>\]"),
    ("model://Birds/1", "", r"model://<model>\[/<version>\]"),
    ("model://birds/1/extra", "", r"model://<model>\[/<version>\]"),
    ("model://birds/1", SHA, "sha256 is for https"),
    ("pvc://Data", "", "pvc://<claim>"),
    ("pvc://data/../other", "", "stay inside the claim"),
    ("pvc://data/a/..", "", "stay inside the claim"),
    ("pvc://data/%2e%2e/x", "", "stay inside the claim"),
    ("pvc://data/%2E%2e", "", "stay inside the claim"),
    ("pvc://data/./x", "", "stay inside the claim"),
    ("pvc://data/a\\..\\b", "", "stay inside the claim"),
    ("pvc://data/a//b", "", "stay inside the claim"),
]


@pytest.mark.parametrize(("uri", "sha256", "words"), BAD)
def test_a_bad_uri_is_refused_with_how_to_write_it(uri: str, sha256: str, words: str) -> None:
    with pytest.raises(InputError, match=words):
        uris.parse(uri, sha256)


def test_a_claim_uri_names_the_claim_and_its_subpath() -> None:
    assert uris.claim_of("pvc://datasets/birds/2024/") == ("datasets", "birds/2024")
    assert uris.claim_of("pvc://datasets") == ("datasets", "")


def test_the_variable_of_an_input() -> None:
    assert uris.env_name("birds") == "TORCHYARD_INPUT_BIRDS"
    assert uris.env_name("base_model") == "TORCHYARD_INPUT_BASE_MODEL"


def test_a_model_uri_without_a_version_names_the_latest_which_is_never_fetched_unpinned() -> None:
    assert uris.model_of("model://birds") == ("birds", "")
    assert uris.model_of("model://birds/12") == ("birds", "12")
    from torchyard.inputs import models

    env = {"TORCHYARD_REGISTRY_URL": "https://registry.invalid"}
    with pytest.raises(InputError, match="names no version: the operator pins"):
        models.fetch(uris.Source("model://birds"), "/nonexistent", env, 1)
