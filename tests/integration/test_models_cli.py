"""`torchyard models` and `torchyard runs download` against the registry service, with a
token checked by the real apiserver: list, show, download (sha256-verified), verify that
catches a corrupted file, and a run's archived file. Through the apiserver's service
proxy the CLI mints a registry-audience token and never forwards the kubeconfig's."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.builders import role_binding
from tests.cluster.harness import Cluster
from tests.integration.conftest import ProxiedRegistry
from tests.integration.test_registry_service import Service, trainer_token, upload
from torchyard import cli, k8s


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


def _user_kubeconfig(cluster: Cluster, namespace: str, path: Path) -> tuple[Path, str]:
    """A kubeconfig whose user is the trainer ServiceAccount, by bearer token (the
    apiserver's audience), allowed to use the registry Service's proxy; and that token."""
    k8s.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "registry-proxy", "namespace": namespace},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["services/proxy"],
                    "resourceNames": ["http:torchyard-registry:8080"],
                    "verbs": ["get", "create"],
                }
            ],
        }
    )
    k8s.create(role_binding(namespace, "trainer-registry-proxy", "registry-proxy", "trainer"))
    token = k8s.request_token(namespace, "trainer", [])
    cfg = yaml.safe_load(cluster.kubeconfig.read_text())
    cfg["users"] = [{"name": "trainer", "user": {"token": token}}]
    for ctx in cfg["contexts"]:
        ctx["context"]["user"] = "trainer"
        ctx["context"]["namespace"] = namespace
    path.write_text(yaml.safe_dump(cfg))
    return path, token


def test_models_through_the_apiserver_service_proxy(
    behind_apiserver: ProxiedRegistry,
    namespace: str,
    cluster: Cluster,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    svc, token = behind_apiserver.service, behind_apiserver.token
    upload(svc, token, namespace, "birds", "model.pt", b"weights" * 5000)
    svc.call(
        "POST",
        f"/v1/namespaces/{namespace}/models/birds/versions",
        token,
        b'{"run": "birds"}',
        {"Content-Type": "application/json"},
    )
    via = ["--registry-service", behind_apiserver.ref]
    # The admin kubeconfig uses a client certificate: the CLI mints a registry token of
    # the namespace's default ServiceAccount, which may not read.
    assert cli.main(["models", "list", "-n", namespace, *via]) == 1
    assert "403" in capsys.readouterr().err
    # A ServiceAccount that may: its short-lived token rides beside the apiserver's auth.
    assert cli.main(["models", "list", "-n", namespace, "--service-account", "trainer", *via]) == 0
    assert capsys.readouterr().out.split("\n")[1].split() == ["birds", "1", "1"]

    # A user whose kubeconfig holds a bearer token: that token is for the apiserver, and
    # the registry refuses it; the CLI never forwards it but mints one, and says which
    # RBAC that needs when the user may not.
    kubeconfig, user_token = _user_kubeconfig(cluster, namespace, tmp_path / "kubeconfig")
    assert svc.call("GET", f"/v1/namespaces/{namespace}/models", user_token)[0] == 401
    dest = tmp_path / "got"
    download = [sys.executable, "-m", "torchyard", "models", "download", "birds", "-o", str(dest)]

    def as_the_user(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*download, *via, *args],
            env={**os.environ, "KUBECONFIG": str(kubeconfig)},
            capture_output=True,
            text=True,
            timeout=60,
        )

    refused = as_the_user("--service-account", "trainer")
    assert refused.returncode == 1
    assert (
        "TokenRequest needs 'create' on 'serviceaccounts/token' (resourceName trainer) in "
        f"namespace {namespace}"
    ) in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr and not dest.exists()
    k8s.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "registry-token", "namespace": namespace},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["serviceaccounts/token"],
                    "resourceNames": ["trainer"],
                    "verbs": ["create"],
                }
            ],
        }
    )
    k8s.create(role_binding(namespace, "trainer-registry-token", "registry-token", "trainer"))
    # The namespace is the context's; the download streams through the proxy and is
    # sha256-verified.
    done = cluster.wait_for(
        "the RoleBinding to take effect",
        lambda: (r := as_the_user("--service-account", "trainer")).returncode == 0 and r,
        30,
        interval=0.5,
    )
    assert "sha256 verified" in done.stdout
    assert (dest / "model.pt").read_bytes() == b"weights" * 5000
