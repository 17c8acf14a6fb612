"""The registry as ``torchyard registry serve --tls-cert --tls-key`` runs it (a process of
its own, checking tokens against the real apiserver): only tokens bound to the registry
audience pass, and every client (the SDK, the CLI, the launcher's uploads and snapshot
fetch, the operator's promotion, the apiserver's service proxy) speaks TLS to it and
verifies its certificate, with a certificate generated here by openssl."""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import ssl
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cluster.harness import Cluster, free_port
from tests.integration.conftest import _host_address, stand_in_service
from tests.integration.test_registry_service import trainer_token, training_run
from tests.unit.registry.test_tls_and_tokens import Pki, make_pki
from torchyard import api, cli, k8s
from torchyard.controller import context, finalize
from torchyard.launch import node_files
from torchyard.planning import pods
from torchyard.sdk import RegistryClient, RegistryError


@dataclass
class TlsRegistry:
    url: str
    pki: Pki
    root: Path

    def client(self, token: str | None, ca: Path | None = None) -> RegistryClient:
        return RegistryClient(self.url, token, ca_file=str(ca or self.pki.ca))


@contextlib.contextmanager
def tls_registry(
    cluster: Cluster, tmp_path: Path, host: str = "127.0.0.1"
) -> Iterator[TlsRegistry]:
    """``torchyard registry serve`` over HTTPS on ``host``, its tokens reviewed by the
    test cluster (KUBECONFIG), until the block ends."""
    pki = make_pki(tmp_path / "pki", "registry", ips=tuple({host, "127.0.0.1"}))
    root, port = tmp_path / "registry", free_port()
    url = f"https://{host}:{port}"
    log = tmp_path / "registry.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "torchyard", "registry", "serve", "--root", str(root),
             "--host", host, "--port", str(port),
             "--tls-cert", str(pki.cert), "--tls-key", str(pki.key)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    verifying = ssl.create_default_context(cafile=pki.ca)

    def up() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"the registry exited:\n{log.read_text()}")
        with urllib.request.urlopen(f"{url}/healthz", timeout=2, context=verifying) as resp:
            return bool(resp.status == 200)

    try:
        cluster.wait_for("the registry over TLS", up, 30)
        yield TlsRegistry(url, pki, root)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
            raise AssertionError(f"SIGTERM did not stop the registry:\n{log.read_text()}") from None
    assert "plain HTTP" not in log.read_text()


def _status(err: pytest.ExceptionInfo[RegistryError]) -> str:
    return str(err.value).split(" ", 1)[0]


def test_only_tokens_bound_to_the_registry_audience_are_accepted(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    registry_token = trainer_token(ns)  # TokenRequest, audience torchyard-registry
    with tls_registry(cluster, tmp_path) as reg:
        assert reg.client(registry_token).models(ns) == {}
        refused = {
            "the apiserver's default audience (as automounted and kubeconfig tokens)": (
                k8s.request_token(ns, "trainer", [])
            ),
            "the apiserver's audience, named": k8s.request_token(
                ns, "trainer", ["https://kubernetes.default.svc.cluster.local"]
            ),
            "another service's audience": k8s.request_token(ns, "trainer", ["vault"]),
        }
        for why, token in refused.items():
            with pytest.raises(RegistryError) as err:
                reg.client(token).models(ns)
            assert _status(err) == "401", why
        # A token for several audiences, the registry's among them, is the registry's too.
        both = k8s.request_token(ns, "trainer", ["vault", api.wire.REGISTRY_AUDIENCE])
        assert reg.client(both).models(ns) == {}
        # The admin's kubeconfig authenticates with a client certificate: the registry
        # takes no client certificates, so that is a request without a token.
        admin = ssl.create_default_context(cafile=reg.pki.ca)
        admin.load_cert_chain(cluster.workdir / "admin.crt", cluster.workdir / "admin.key")
        with pytest.raises(RegistryError) as err:
            RegistryClient(reg.url, None, ssl_context=admin).models(ns)
        assert _status(err) == "401"


def _snapshot(folder: Path) -> tuple[Path, str]:
    """A source snapshot (tar.gz of one file) and its sha256."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        body = b"print('over tls')\n"
        info = tarfile.TarInfo("train.py")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    archive = folder / "source.tar.gz"
    archive.write_bytes(data.getvalue())
    return archive, hashlib.sha256(data.getvalue()).hexdigest()


def test_every_client_verifies_the_registrys_certificate(
    cluster: Cluster,
    namespace: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    operator_client: k8s.Client,
) -> None:
    ns = namespace
    token = trainer_token(ns)
    training_run(ns, "birds", "trainer")  # only its ServiceAccount may write its archive
    token_file = tmp_path / "token"
    token_file.write_text(token)
    impostor = make_pki(tmp_path / "impostor", "registry")
    weights = tmp_path / "model.pt"
    weights.write_bytes(os.urandom(3 << 20))
    with tls_registry(cluster, tmp_path) as reg:
        pem = reg.pki.ca_pem
        # The launcher uploads with the CA the operator hands node Pods; without it the
        # system's CAs do not know this one, and nothing is sent.
        target = f"{reg.url}/v1/namespaces/{ns}/runs/birds/outputs/model.pt"
        with pytest.raises(ssl.SSLCertVerificationError):
            node_files.upload_file(target, str(weights), token)
        node_files.upload_file(
            target,
            str(weights),
            token,
            node_files.registry_context({"TORCHYARD_REGISTRY_CA": pem}),
        )
        # The SDK verifies with the CA it is given, and refuses any other.
        assert reg.client(token).run_files(ns, "birds") == ["outputs/model.pt"]
        for ca in (impostor.ca, None):
            client = (
                reg.client(token, ca) if ca else RegistryClient(reg.url, token)
            )  # None: the system's CAs
            with pytest.raises(RegistryError, match="CERTIFICATE_VERIFY_FAILED"):
                client.run_files(ns, "birds")
        with pytest.raises(RegistryError, match="not reachable"):  # plain HTTP to TLS
            RegistryClient(reg.url.replace("https:", "http:"), token).run_files(ns, "birds")
        # The CLI: --registry-ca for a direct https URL.
        dest = tmp_path / "got.pt"
        direct = ["runs", "download", "birds", "outputs/model.pt", "-o", str(dest), "-n", ns,
                  "--registry-url", reg.url, "--token-file", str(token_file)]  # fmt: skip
        assert cli.main(direct) == 1
        assert "CERTIFICATE_VERIFY_FAILED" in capsys.readouterr().err and not dest.exists()
        assert cli.main([*direct, "--registry-ca", str(reg.pki.ca)]) == 0
        assert dest.read_bytes() == weights.read_bytes()

        # A node Pod's launcher fetches a snapshot with TORCHYARD_REGISTRY_CA.
        archive, sha = _snapshot(tmp_path)
        assert reg.client(token).put_snapshot(ns, archive, sha) is True
        env = {
            "TORCHYARD_REGISTRY_URL": reg.url,
            "TORCHYARD_NAMESPACE": ns,
            "TORCHYARD_REGISTRY_TOKEN_FILE": str(token_file),
        }
        work = tmp_path / "work"
        fetch = ["--fetch", sha, str(work)]
        with _environ(env):
            assert node_files.prepare(fetch) == 1  # the system's CAs: refused
        assert "CERTIFICATE_VERIFY_FAILED" in capsys.readouterr().err
        assert not (work / "train.py").exists()
        with _environ({**env, "TORCHYARD_REGISTRY_CA": pem}):
            assert node_files.prepare(fetch) == 0
        assert (work / "train.py").read_text() == "print('over tls')\n"

        # The operator promotes over TLS with the CA the chart mounts (settings.registry_ca).
        body = k8s.get(k8s.TRAININGRUNS, ns, "birds")  # its uid: the one the archive is of
        body["spec"]["outputs"] = {"register": {"model": "birds"}}
        run = api.parse_trainingrun(body)
        log = logging.getLogger("test")

        def promote(ca: str) -> finalize.Registration:
            settings = pods.Settings(
                registry_url=reg.url, registry_token_file=str(token_file), registry_ca=ca
            )
            ctx = context.Context(settings=settings, k8s=operator_client)
            return finalize.register(run, None, ctx, log)

        refused = promote("")
        assert refused.model is None and "CERTIFICATE_VERIFY_FAILED" in refused.waiting
        refused = promote(impostor.ca_pem)
        assert refused.model is None and "CERTIFICATE_VERIFY_FAILED" in refused.waiting
        assert promote(pem) == finalize.Registration({"name": "birds", "version": 1})
        assert k8s.get(k8s.MODELVERSIONS, ns, "birds-v1")["spec"]["version"] == 1


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def test_the_cli_reaches_an_https_registry_through_the_apiserver(
    cluster: Cluster,
    namespace: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TORCHYARD_REGISTRY_URL", raising=False)
    ns = namespace
    token = trainer_token(ns)
    training_run(ns, "birds", "trainer")
    address = _host_address()
    with tls_registry(cluster, tmp_path, host=address) as reg:
        weights = tmp_path / "model.pt"
        weights.write_bytes(b"weights" * 1000)
        node_files.upload_file(
            f"{reg.url}/v1/namespaces/{ns}/runs/birds/outputs/model.pt",
            str(weights),
            token,
            node_files.registry_context({"TORCHYARD_REGISTRY_CA": reg.pki.ca_pem}),
        )
        port = int(reg.url.rsplit(":", 1)[1])
        ref = stand_in_service(cluster, ns, address, port, scheme="https")
        assert ref == f"{ns}/torchyard-registry:8080"  # https needs no prefix: the default
        common = ["-n", ns, "--service-account", "trainer"]
        got = ["runs", "download", "birds", "outputs/model.pt", "-o", str(tmp_path / "got.pt")]
        assert cli.main([*got, *common, "--registry-service", ref]) == 0
        assert (tmp_path / "got.pt").read_bytes() == weights.read_bytes()
        # Plain HTTP to the TLS port: the registry never answers it.
        assert cli.main(["models", "list", *common, "--registry-service", f"http:{ref}"]) == 1
        assert "torchyard: error:" in capsys.readouterr().err


def test_a_wrong_audience_through_the_header_the_proxy_forwards_is_refused(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """``X-Torchyard-Token`` (the proxy path's header) gets the same review."""
    ns = namespace
    trainer_token(ns)
    with tls_registry(cluster, tmp_path) as reg:
        context = ssl.create_default_context(cafile=reg.pki.ca)
        for token, expected in (
            (k8s.request_token(ns, "trainer", []), 401),
            (k8s.request_token(ns, "trainer", [api.wire.REGISTRY_AUDIENCE]), 200),
        ):
            req = urllib.request.Request(
                f"{reg.url}/v1/namespaces/{ns}/models", headers={"X-Torchyard-Token": token}
            )
            try:
                with urllib.request.urlopen(req, timeout=30, context=context) as resp:
                    got = resp.status
            except urllib.error.HTTPError as err:
                got = err.code
            assert got == expected
