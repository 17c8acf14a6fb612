"""``torchyard.k8s`` raises its own :class:`~torchyard.k8s.Unreachable` when the API cannot be
reached: a kubeconfig that is missing, not a kubeconfig, or names certificates that do not
load; an in-cluster Pod without its ServiceAccount token; a server that does not answer.
Its callers (the SDK, the CLI, the registry client through the service proxy) need none of
the client library's or urllib3's exceptions to say so, and say it in the same words."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes.config import incluster_config

from torchyard import k8s
from torchyard.k8s import errors
from torchyard.sdk import clusters
from torchyard.sdk.registry import RegistryClient

# Port 1 on loopback: nothing listens there, the connection is refused at once.
REFUSED = "https://127.0.0.1:1"


def kubeconfig(tmp_path: Path, user: dict[str, str]) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": REFUSED}}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


@pytest.fixture(autouse=True)
def fresh_client(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    k8s.reset()
    yield
    k8s.reset()


def test_the_sdk_raises_the_k8s_layers_errors() -> None:
    assert clusters.Unreachable is k8s.Unreachable is errors.Unreachable
    assert clusters.ApiError is k8s.ApiError
    assert not hasattr(clusters, "reaching")  # nothing left to translate


def test_a_missing_kubeconfig(tmp_path: Path) -> None:
    with pytest.raises(k8s.Unreachable) as err:
        clusters.connect(str(tmp_path / "missing"))
    assert str(err.value).startswith("cannot reach the Kubernetes API: Invalid kube-config")
    assert str(err.value).endswith(f"; {errors.ADVICE}")


def test_a_context_the_kubeconfig_does_not_have(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, {"token": "t"})
    with pytest.raises(k8s.Unreachable, match="nope") as err:
        clusters.connect(str(path), "nope")
    assert str(err.value).endswith(f"; {errors.ADVICE}")


@pytest.mark.parametrize("text", ["just text\n", "[1, 2]\n", "a: [unclosed\n"])
def test_a_file_that_is_not_a_kubeconfig(tmp_path: Path, text: str) -> None:
    path = tmp_path / "notes"
    path.write_text(text)
    with pytest.raises(k8s.Unreachable) as err:
        k8s.load(str(path))
    message = str(err.value)
    assert message.startswith(f"cannot reach the Kubernetes API: {path} is not a kubeconfig: ")
    assert "\n" not in message and message.endswith(f"; {errors.ADVICE}")


def test_certificates_that_do_not_load(tmp_path: Path) -> None:
    (tmp_path / "c.pem").write_text("not a certificate\n")
    (tmp_path / "k.pem").write_text("not a key\n")
    path = kubeconfig(
        tmp_path,
        {"client-certificate": str(tmp_path / "c.pem"), "client-key": str(tmp_path / "k.pem")},
    )
    k8s.load(str(path))
    with pytest.raises(k8s.Unreachable, match=r"cannot load the kubeconfig's certificates \("):
        k8s.connection()
    # ... and so the registry, through the apiserver's service proxy, says the same
    with pytest.raises(k8s.Unreachable, match=r"cannot load the kubeconfig's certificates \("):
        RegistryClient.through_kubernetes("team")


def test_in_a_pod_without_its_service_account_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    # where the client looks for the Pod's token: not there (automountServiceAccountToken off)
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    with pytest.raises(k8s.Unreachable, match="token file does not exist") as err:
        k8s.load()
    assert str(err.value).endswith(f"; {errors.IN_CLUSTER_ADVICE}")


def test_a_server_that_does_not_answer(tmp_path: Path) -> None:
    k8s.load(str(kubeconfig(tmp_path, {"token": "t"})))
    where = f"cannot reach the Kubernetes API at {REFUSED}: "
    with pytest.raises(k8s.Unreachable, match=where) as err:
        k8s.list_(k8s.PODS, "team")
    assert str(err.value).endswith(f"; {errors.ADVICE}")
    with pytest.raises(k8s.Unreachable, match=where):
        k8s.request_token("team", "default", ["torchyard-registry"])
    with pytest.raises(k8s.Unreachable, match=where):
        next(k8s.pod_log_lines("team", "bert-0", follow=True))
