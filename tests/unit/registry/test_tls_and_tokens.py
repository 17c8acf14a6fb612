"""The registry's transport and credentials without a cluster: its HTTPS certificate
(loaded, verified by clients, reloaded when renewed, bad files refused clearly), the
registry audience as the only one a token may carry, and the CLI and SDK minting a
registry token instead of forwarding the kubeconfig's. ``tests/integration/
test_registry_tls.py`` checks the same against the real apiserver.

``make_pki`` (openssl, as the cluster harness uses it) is shared with that module.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder
from torchyard import api, cli, k8s, registry_server
from torchyard.controller import handlers
from torchyard.launch import node_files
from torchyard.planning import pods
from torchyard.registry import service
from torchyard.sdk import registry as sdk_registry
from torchyard.sdk.registry import RegistryClient, RegistryError

OPERATOR = Path(__file__).resolve().parents[3] / "operator" / "torchyard"


@dataclass(frozen=True)
class Pki:
    """A CA and a serving certificate it signed (PEM files)."""

    ca: Path
    cert: Path
    key: Path

    @property
    def ca_pem(self) -> str:
        return self.ca.read_text()


def make_pki(folder: Path, name: str, ips: tuple[str, ...] = ("127.0.0.1",)) -> Pki:
    """A fresh CA ``name`` and a certificate for ``ips`` and localhost, in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", f"/CN={name}-ca",
    )  # fmt: skip
    openssl("req", *ec, "-keyout", "tls.key", "-out", "tls.csr", "-subj", f"/CN={name}")
    sans = ",".join([f"IP:{ip}" for ip in ips] + ["DNS:localhost"])
    (folder / "ext.cnf").write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"
        f"subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\nsubjectAltName={sans}\n"
    )
    openssl(
        "x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "tls.crt", "-days", "2", "-extfile", "ext.cnf",
    )  # fmt: skip
    return Pki(folder / "ca.crt", folder / "tls.crt", folder / "tls.key")


@pytest.fixture(autouse=True)
def _ca_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TORCHYARD_REGISTRY_CA", "TORCHYARD_REGISTRY_CA_FILE", "TORCHYARD_TOKEN"):
        monkeypatch.delenv(name, raising=False)


# -- the service's certificate ----------------------------------------------------------


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> str:
    """Serve one TLS connection with ``server``; '' when ``client`` accepted it, else the
    client's verification error."""

    async def scenario() -> str:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"ok")
            await writer.drain()
            writer.close()

        srv = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server)
        port = srv.sockets[0].getsockname()[1]
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client, server_hostname="127.0.0.1"
            )
            assert await reader.read() == b"ok"
            writer.close()
            return ""
        except ssl.SSLCertVerificationError as err:
            return str(err.verify_message)
        finally:
            srv.close()
            await srv.wait_closed()

    return asyncio.run(scenario())


def test_clients_that_trust_the_ca_accept_the_certificate_and_others_refuse_it(
    tmp_path: Path,
) -> None:
    pki = make_pki(tmp_path / "a", "registry")
    tls = service.TLSFiles(pki.cert, pki.key)
    assert tls.context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert _handshake(tls.context, ssl.create_default_context(cafile=pki.ca)) == ""
    other = make_pki(tmp_path / "b", "impostor")
    refused = _handshake(tls.context, ssl.create_default_context(cafile=other.ca))
    assert "unable to get local issuer certificate" in refused
    # The launcher's and the SDK's contexts come from the CA the operator hands out.
    verifying = node_files.registry_context({"TORCHYARD_REGISTRY_CA": pki.ca_pem})
    assert verifying is not None and _handshake(tls.context, verifying) == ""
    assert node_files.registry_context({}) is None  # the system's CAs
    client = RegistryClient("https://127.0.0.1:1", "t", ca_file=str(pki.ca))
    assert client.ssl_context is not None and _handshake(tls.context, client.ssl_context) == ""


def test_a_renewed_certificate_is_loaded_for_new_connections(tmp_path: Path) -> None:
    old, new = make_pki(tmp_path / "old", "registry"), make_pki(tmp_path / "new", "registry")
    served = tmp_path / "served"
    served.mkdir()
    cert, key = served / "tls.crt", served / "tls.key"
    cert.write_bytes(old.cert.read_bytes())
    key.write_bytes(old.key.read_bytes())
    tls = service.TLSFiles(cert, key)
    assert tls.refresh() is False  # unchanged: nothing loaded again
    trusts_new = ssl.create_default_context(cafile=new.ca)
    assert _handshake(tls.context, trusts_new) != ""
    # The renewal lands (cert-manager writes the Secret, the kubelet swaps the files).
    cert.write_bytes(new.cert.read_bytes())
    key.write_bytes(new.key.read_bytes())
    assert tls.refresh() is True
    assert _handshake(tls.context, trusts_new) == ""
    # Half-written (a new certificate beside the old key): refused, the loaded one stays.
    cert.write_bytes(old.cert.read_bytes())
    with pytest.raises(ValueError, match="not a PEM certificate and its private key"):
        tls.refresh()
    assert _handshake(tls.context, trusts_new) == ""


def test_bad_certificate_files_are_refused_with_what_to_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pki = make_pki(tmp_path / "pki", "registry")
    other = make_pki(tmp_path / "other", "registry")
    with pytest.raises(ValueError, match="cannot read the TLS certificate or key"):
        service.TLSFiles(tmp_path / "missing.crt", pki.key)
    with pytest.raises(ValueError, match="not a PEM certificate and its private key"):
        service.TLSFiles(pki.cert, other.key)  # a key that is not the certificate's
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    with pytest.raises(ValueError, match="not a PEM certificate"):
        service.TLSFiles(garbage, pki.key)
    root = ["registry", "serve", "--root", str(tmp_path / "data")]
    assert cli.main([*root, "--tls-cert", str(pki.cert)]) == 2
    assert "--tls-cert and --tls-key go together" in capsys.readouterr().err
    assert cli.main([*root, "--tls-cert", str(pki.cert), "--tls-key", str(other.key)]) == 2
    assert "not a PEM certificate and its private key" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()  # nothing served, nothing written


def test_serve_uses_https_with_a_certificate_and_warns_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[dict[str, Any]] = []

    def run_app(app: Any, **kwargs: Any) -> None:
        ran.append({"app": app, **kwargs})

    monkeypatch.setattr(service.web, "run_app", run_app)
    with caplog.at_level(logging.WARNING, logger="torchyard.registry"):
        service.serve(tmp_path / "plain", registry_server.kubernetes_authorizer(), port=1)
    assert ran[-1]["ssl_context"] is None
    assert "serving plain HTTP" in caplog.text and "--tls-cert" in caplog.text
    caplog.clear()
    pki = make_pki(tmp_path / "pki", "registry")
    tls = service.TLSFiles(pki.cert, pki.key)
    with caplog.at_level(logging.WARNING, logger="torchyard.registry"):
        service.serve(tmp_path / "tls", registry_server.kubernetes_authorizer(), port=1, tls=tls)
    assert ran[-1]["ssl_context"] is tls.context
    assert "plain HTTP" not in caplog.text
    assert len(ran[-1]["app"].cleanup_ctx) > len(ran[0]["app"].cleanup_ctx)  # the reloader


# -- tokens: the registry audience only --------------------------------------------------


def test_the_registry_audience_has_one_definition() -> None:
    assert api.wire.REGISTRY_AUDIENCE == pods.REGISTRY_AUDIENCE == "torchyard-registry"
    defined = [
        str(path.relative_to(OPERATOR))
        for path in OPERATOR.rglob("*.py")
        if re.search(r"""["']torchyard-registry["']""", path.read_text())
    ]
    assert defined == ["api/wire.py"]


def _tokenreviews(monkeypatch: pytest.MonkeyPatch, answer: dict[str, Any]) -> list[dict[str, Any]]:
    """k8s.rest.create answering every TokenReview with ``answer``; the reviews asked."""
    asked: list[dict[str, Any]] = []

    def create(body: dict[str, Any]) -> dict[str, Any]:
        assert body["kind"] == "TokenReview"
        asked.append(body["spec"])
        return {"status": answer}

    monkeypatch.setattr(k8s.rest, "create", create)  # what k8s.review_token sends through
    return asked


def test_the_authorizer_asks_for_the_registry_audience_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The apiserver says a kubeconfig/automounted token is not for torchyard-registry:
    # no second review with the apiserver's audience (the fallback this replaced).
    asked = _tokenreviews(monkeypatch, {"authenticated": False})
    assert registry_server.kubernetes_authorizer().user("apiserver-token") is None
    assert asked == [{"token": "apiserver-token", "audiences": ["torchyard-registry"]}]


@pytest.mark.parametrize(
    "status, allowed",
    [
        ({"authenticated": True, "audiences": ["torchyard-registry"]}, True),
        ({"authenticated": True, "audiences": ["https://kubernetes.default.svc"]}, False),
        ({"authenticated": True}, False),  # an authenticator that ignored the audiences
        ({"authenticated": False, "audiences": ["torchyard-registry"]}, False),
    ],
    ids=["registry", "apiserver's", "none said", "not authenticated"],
)
def test_a_review_must_vouch_for_the_registry_audience(
    monkeypatch: pytest.MonkeyPatch, status: dict[str, Any], allowed: bool
) -> None:
    user = {"username": "system:serviceaccount:team:trainer", "uid": "u1"}
    _tokenreviews(monkeypatch, {**status, "user": user})
    assert registry_server.kubernetes_authorizer().user("t") == (user if allowed else None)


# -- the CLI and SDK mint a registry token -----------------------------------------------


@pytest.fixture
def kubeconfig_with_a_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[str, str, list[str]]]:
    """k8s.connection as for a kubeconfig holding a bearer token ($KUBECONFIG names one,
    so the CLI reads the cluster, whatever this machine has); the tokens minted."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    minted: list[tuple[str, str, list[str]]] = []

    def request_token(namespace: str, name: str, audiences: list[str], seconds: int = 600) -> str:
        minted.append((namespace, name, audiences))
        return f"minted-{name}"

    conn = k8s.Connection("https://api:6443", None, {"Authorization": "Bearer KUBECONFIG"})
    monkeypatch.setattr(k8s, "connection", lambda: conn)
    monkeypatch.setattr(k8s, "request_token", request_token)
    return minted


def test_through_kubernetes_mints_a_token_and_never_forwards_the_kubeconfigs(
    kubeconfig_with_a_token: list[tuple[str, str, list[str]]],
) -> None:
    client = RegistryClient.through_kubernetes("team")
    assert kubeconfig_with_a_token == [("team", "default", ["torchyard-registry"])]
    assert client.headers["X-Torchyard-Token"] == "minted-default"
    assert client.headers["Authorization"] == "Bearer KUBECONFIG"  # for the apiserver only
    assert client.url == (
        "https://api:6443/api/v1/namespaces/torchyard-system/services/"
        "https:torchyard-registry:8080/proxy"
    )
    plain = RegistryClient.through_kubernetes("team", "trainer", "http:ml/models:80")
    assert kubeconfig_with_a_token[-1] == ("team", "trainer", ["torchyard-registry"])
    assert plain.headers["X-Torchyard-Token"] == "minted-trainer"
    assert plain.url.endswith("/api/v1/namespaces/ml/services/http:models:80/proxy")
    for bad in ("models:80", "ml/models", "ftp:ml/models:80", "ml/models:http"):
        with pytest.raises(RegistryError, match=r"expected \[http:\|https:\]NAMESPACE/NAME:PORT"):
            RegistryClient.through_kubernetes("team", service=bad)


@pytest.mark.parametrize(
    "status, says",
    [
        (403, "TokenRequest needs 'create' on 'serviceaccounts/token' (resourceName trainer) "
         "in namespace team"),
        (404, "ServiceAccount team/trainer does not exist"),
        (500, "cannot get a registry token of ServiceAccount team/trainer"),
    ],
)  # fmt: skip
def test_a_token_that_cannot_be_minted_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    kubeconfig_with_a_token: list[tuple[str, str, list[str]]],
    status: int,
    says: str,
) -> None:
    def refuse(namespace: str, name: str, audiences: list[str], seconds: int = 600) -> str:
        raise k8s.ApiError(status, "Forbidden", "no")

    monkeypatch.setattr(k8s, "request_token", refuse)
    with pytest.raises(RegistryError) as err:
        RegistryClient.through_kubernetes("team", "trainer")
    assert says in str(err.value)
    monkeypatch.delenv("TORCHYARD_REGISTRY_URL", raising=False)
    assert cli.main(["models", "list", "-n", "team", "--service-account", "trainer"]) == 1
    assert says in capsys.readouterr().err


def test_a_bad_registry_ca_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(RegistryError, match="cannot load the registry's CA certificate"):
        RegistryClient("https://registry:8080", "t", ca_file=str(tmp_path / "missing.crt"))
    monkeypatch.setenv("TORCHYARD_REGISTRY_CA", "not a certificate")
    with pytest.raises(RegistryError, match="from TORCHYARD_REGISTRY_CA"):
        RegistryClient("https://registry:8080", "t")
    with pytest.raises(ssl.SSLError):
        node_files.registry_context({"TORCHYARD_REGISTRY_CA": "not a certificate"})
    # Through the service proxy the apiserver connects to the registry: no CA to pass.
    monkeypatch.delenv("TORCHYARD_REGISTRY_URL", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))  # a cluster, not --local
    assert cli.main(["models", "list", "-n", "team", "--registry-ca", "ca.crt"]) == 1
    assert "--registry-ca goes with --registry-url" in capsys.readouterr().err


def test_a_plain_http_url_needs_no_tls_context() -> None:
    assert RegistryClient("http://registry:8080", "t").ssl_context is None
    assert sdk_registry.DEFAULT_SERVICE == "torchyard-system/torchyard-registry:8080"


# -- node Pods get the CA ------------------------------------------------------------------


def test_node_pods_get_the_registry_ca_with_the_registry_url() -> None:
    body = TrainingRunBuilder("birds", "team").nodes(2).source(snapshot="a" * 64).obj()
    run = api.parse_trainingrun(body)
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    tls = pods.Settings(registry_url="https://registry:8080", registry_ca=pem)
    for pod in pods.pods(run, image="img", settings=tls):
        # the trainer's launcher downloads the snapshot and archives with it
        trainer = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
        assert trainer["TORCHYARD_REGISTRY_CA"] == pem
        assert "--fetch" in pod["spec"]["containers"][0]["command"]
    plain = pods.Settings(registry_url="http://registry:8080")
    for pod in pods.pods(run, image="img", settings=plain):
        names = [e["name"] for c in pod["spec"].get("initContainers", []) for e in c["env"]]
        names += [e["name"] for e in pod["spec"]["containers"][0]["env"]]
        assert "TORCHYARD_REGISTRY_CA" not in names


def test_the_operator_reads_the_ca_the_chart_mounts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pki = make_pki(tmp_path / "pki", "registry")
    monkeypatch.setenv("TORCHYARD_REGISTRY_URL", "https://torchyard-registry.ty.svc:8080")
    monkeypatch.setenv("TORCHYARD_REGISTRY_CA_FILE", str(pki.ca))
    assert handlers._settings({}).registry_ca == pki.ca_pem
    monkeypatch.setenv("TORCHYARD_REGISTRY_CA_FILE", str(tmp_path / "missing.crt"))
    with pytest.raises(RuntimeError, match="TORCHYARD_REGISTRY_CA_FILE: cannot read"):
        handlers._settings({})
    monkeypatch.delenv("TORCHYARD_REGISTRY_CA_FILE")
    assert handlers._settings({}).registry_ca == ""
