"""`torchyard models` and `torchyard runs download` against the registry service, with a
token checked by the real apiserver: list, show, download (sha256-verified), verify that
catches a corrupted file, and a run's archived file."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.harness import Cluster
from tests.integration.test_registry_service import Service, trainer_token, upload
from torchyard import cli


@pytest.fixture
def published(
    tmp_path: Path, namespace: str, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Service, str]]:
    svc = Service(tmp_path / "registry")
    token = trainer_token(namespace)
    upload(svc, token, namespace, "birds", "model.pt", b"weights" * 5000)
    upload(svc, token, namespace, "birds", "metrics.json", b'{"accuracy": 0.86}')
    svc.call(
        "POST",
        f"/v1/namespaces/{namespace}/models/birds/versions",
        token,
        b'{"run": "birds", "metadata": {"run": {"name": "birds"}}}',
        {"Content-Type": "application/json"},
    )
    token_file = tmp_path / "token"
    token_file.write_text(token)
    monkeypatch.setenv("TORCHYARD_REGISTRY_URL", svc.url)
    yield svc, str(token_file)
    svc.stop()


def test_list_show_download_and_verify(
    published: tuple[Service, str],
    namespace: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    svc, token = published
    common = ["-n", namespace, "--token-file", token]
    assert cli.main(["models", "list", *common]) == 0
    assert capsys.readouterr().out.split("\n")[1].split() == ["birds", "1", "1"]

    assert cli.main(["models", "show", "birds:1", *common]) == 0
    shown = capsys.readouterr().out
    assert "birds version 1" in shown and "metric accuracy = 0.86" in shown
    assert hashlib.sha256(b"weights" * 5000).hexdigest()[:16] in shown

    assert cli.main(["models", "download", "birds", "-o", str(tmp_path / "got"), *common]) == 0
    assert (tmp_path / "got" / "model.pt").read_bytes() == b"weights" * 5000
    assert "sha256 verified" in capsys.readouterr().out

    assert cli.main(["models", "verify", "birds", *common]) == 0
    assert "all 2 file(s) match" in capsys.readouterr().out
    # Someone changes a byte on the volume: verify says so, download refuses it.
    stored = svc.root / namespace / "models" / "birds" / "1" / "model.pt"
    stored.write_bytes(b"Weights" * 5000)
    assert cli.main(["models", "verify", "birds:1", *common]) == 1
    assert "do not match the manifest: model.pt" in capsys.readouterr().err
    assert cli.main(["models", "download", "birds", "-o", str(tmp_path / "bad"), *common]) == 1
    assert "does not match the manifest" in capsys.readouterr().err
    assert not (tmp_path / "bad" / "model.pt").exists()


def test_runs_download_and_clear_errors(
    published: tuple[Service, str],
    namespace: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, token = published
    dest = tmp_path / "metrics.json"
    assert (
        cli.main(
            [
                "runs",
                "download",
                "birds",
                "outputs/metrics.json",
                "-o",
                str(dest),
                "-n",
                namespace,
                "--token-file",
                token,
            ]
        )
        == 0
    )
    assert dest.read_text() == '{"accuracy": 0.86}'
    assert cli.main(["models", "list", "-n", namespace]) == 1  # no token at all
    assert "401" in capsys.readouterr().err
    assert cli.main(["models", "show", "nope", "-n", namespace, "--token-file", token]) == 1
    assert "model" in capsys.readouterr().err
