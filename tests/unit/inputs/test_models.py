"""Fetching a ``model://`` input from the registry service itself (its aiohttp app on a
loopback port, with the stand-in authorizer of its own tests): the version's files land
checked against the manifest, a killed fetch does not fetch its whole files again, and a
missing version or a refused reader is an InputError naming the URI and the fix."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.registry.test_service import USER, A, B, Served, StandIn
from torchyard.inputs import cache, fetch, models
from torchyard.inputs.uris import InputError, Source
from torchyard.registry import Store
from torchyard.registry.service import Limits

LIMIT = 1 << 30


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Served]:
    root = tmp_path / "registry"
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "weights.pt").write_bytes(os.urandom(200_000))
    (model / "sub" / "config.json").write_text('{"layers": 2}')
    Store(root).publish(A, "birds", model)
    svc = Served(root, StandIn(), Limits())
    yield svc
    svc.stop()


def env(svc: Served, tmp_path: Path, namespace: str = A, token: str = USER) -> dict[str, str]:
    (tmp_path / "token").write_text(token)
    return {
        "TORCHYARD_REGISTRY_URL": f"http://127.0.0.1:{svc.port}",
        "TORCHYARD_NAMESPACE": namespace,
        "TORCHYARD_REGISTRY_TOKEN_FILE": str(tmp_path / "token"),
    }


def test_a_model_version_lands_checked_against_its_manifest(
    registry: Served, tmp_path: Path
) -> None:
    source = Source("model://birds/1", reader="trainer")
    done = fetch.fetch(source, str(tmp_path / "cache"), LIMIT, env(registry, tmp_path))
    data = Path(cache.data_dir(str(tmp_path / "cache"), source.key))
    assert (data / "sub" / "config.json").read_text() == '{"layers": 2}'
    assert sorted(f["path"] for f in done.entry.files) == ["sub/config.json", "weights.pt"]
    assert done.entry.revision == "1"
    assert done.fetched_bytes == done.entry.bytes
    again = fetch.fetch(source, str(tmp_path / "cache"), LIMIT, env(registry, tmp_path))
    assert again.fetched_bytes == 0


def test_the_reader_is_part_of_the_key() -> None:
    assert Source("model://birds/1", reader="a").key != Source("model://birds/1", reader="b").key


def test_a_killed_fetch_keeps_its_whole_files(registry: Served, tmp_path: Path) -> None:
    source = Source("model://birds/1", include=("*.pt", "config.json"), reader="trainer")
    root = str(tmp_path / "cache")
    staging = Path(cache.staging_dir(root, source.key)) / "data"
    (staging / "sub").mkdir(parents=True)
    whole = (registry.root / A / "models" / "birds" / "1" / "sub" / "config.json").read_bytes()
    (staging / "sub" / "config.json").write_bytes(whole)
    weights = (registry.root / A / "models" / "birds" / "1" / "weights.pt").read_bytes()
    (staging / "weights.pt").write_bytes(weights[:50_000])
    done = fetch.fetch(source, root, LIMIT, env(registry, tmp_path))
    assert done.fetched_bytes == len(weights) - 50_000, "only the rest of the partial file"
    assert (Path(cache.data_dir(root, source.key)) / "weights.pt").read_bytes() == weights


@pytest.mark.parametrize(
    ("uri", "namespace", "words"),
    [
        ("model://birds/7", A, "HTTP 404 .*model birds has no version 7 in namespace team-a"),
        ("model://nothing/1", A, "HTTP 404 .*model nothing has no version 1"),
        ("model://birds/1", B, "HTTP 403 .*may not read models in team-b: grant it get"),
    ],
)
def test_a_version_it_cannot_read_is_an_error_naming_the_uri(
    registry: Served, tmp_path: Path, uri: str, namespace: str, words: str
) -> None:
    with pytest.raises(InputError, match=f"^{uri}: {words}"):
        fetch.fetch(Source(uri), str(tmp_path / "cache"), LIMIT, env(registry, tmp_path, namespace))


def test_a_token_the_registry_refuses(registry: Served, tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"HTTP 401 .*does not take the token"):
        fetch.fetch(
            Source("model://birds/1"),
            str(tmp_path / "c"),
            LIMIT,
            env(registry, tmp_path, token="kubernetes-api-token"),
        )


def test_no_registry_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no model registry service"):
        models.fetch(Source("model://birds/1"), str(tmp_path), {}, LIMIT)


def test_a_model_over_the_cache_limit_is_refused_before_a_byte(
    registry: Served, tmp_path: Path
) -> None:
    with pytest.raises(InputError, match="over the inputs cache's limit of 1000 bytes"):
        fetch.fetch(Source("model://birds/1"), str(tmp_path / "c"), 1000, env(registry, tmp_path))
