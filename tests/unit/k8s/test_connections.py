"""``k8s.connection`` in a Pod: the bearer token the official client's in-cluster loader
keeps is the one Kopf's login (controller/handlers.py) and the service-proxy streams show
the apiserver. Without it the operator's own Pod talks to the apiserver as
``system:anonymous`` (found by tests/node/test_chart_on_node.py)."""

from __future__ import annotations

from pathlib import Path

import certifi
import pytest
from kubernetes import client
from kubernetes.config.incluster_config import InClusterConfigLoader

from torchyard import k8s
from torchyard.k8s import connections


def test_the_in_cluster_token_is_the_connections_bearer_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    token.write_text("the-service-account-token")
    cfg = client.Configuration()
    InClusterConfigLoader(
        token_filename=str(token),
        cert_filename=certifi.where(),  # any PEM bundle: the Pod's is the cluster's CA
        environ={"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"},
    ).load_and_set(cfg)
    api = client.ApiClient(configuration=cfg)
    monkeypatch.setattr(connections, "load", lambda: api)
    conn = k8s.connection()
    assert conn.host == "https://10.96.0.1:443"
    assert conn.bearer_token == "the-service-account-token"


@pytest.mark.parametrize(
    "header, token",
    [
        ("Bearer abc", "abc"),
        ("bearer abc", "abc"),  # what the in-cluster loader writes
        ("BEARER abc", "abc"),
        ("Basic dXNlcjpwYXNz", None),
        ("Bearer ", None),
        ("", None),
    ],
)
def test_the_bearer_scheme_is_case_insensitive(header: str, token: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    assert k8s.Connection("https://api:6443", None, headers).bearer_token == token


def test_the_environments_proxy_is_read_once_not_on_every_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a kubeconfig token the client's refresh hook assigns the host before every
    request; the proxy the environment named when the client was configured stays (the
    walk over os.environ each time raced with threads that change it)."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://10.0.0.1:6443'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    cfg = connections.configure(str(path)).configuration
    assert cfg.proxy == "http://proxy.example:3128"
    monkeypatch.setenv("HTTPS_PROXY", "http://another.example:3128")
    assert cfg.auth_settings()["BearerToken"]["value"] == "Bearer t"  # the refresh hook ran
    assert cfg.host == "https://10.0.0.1:6443"
    assert cfg.proxy == "http://proxy.example:3128"
