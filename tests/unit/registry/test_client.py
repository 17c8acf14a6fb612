"""One HTTP client of the registry service (``torchyard.registry.client``), used by the
operator's finalize step and the SDK alike, and one promotion metadata
(``planning.models.promote_metadata``) sent by both and published by local mode. The
service here is a stand-in on loopback that answers a promotion as the real one does
(``store.check_metadata``: 400 for a key it does not accept); the real service is
exercised in tests/integration/test_registry_service.py."""

from __future__ import annotations

import http.server
import io
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder
from tests.unit.controller.fake_k8s import FakeK8s
from torchyard import api, k8s, local
from torchyard.controller import context, finalize
from torchyard.planning import models, pods
from torchyard.registry import Store, store
from torchyard.registry.client import RegistryClient, RegistryError
from torchyard.sdk import Experiment, Run, TorchyardSdkError, Workspace, runs

IMAGE = "reg.local/envs@sha256:" + "b" * 64


class Service(http.server.BaseHTTPRequestHandler):
    """POST .../models/<model>/versions: 201 with a manifest, or 400 as the real one."""

    promotions: list[tuple[str, dict[str, Any], str]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.promotions.append((self.path, body, self.headers.get("Authorization", "")))
        try:
            store.check_metadata(body.get("metadata") or {})
        except ValueError as err:
            self._send(400, str(err).encode())
            return
        manifest = {"version": 4, "files": [{"path": "model.pt", "sha256": "0" * 64}]}
        self._send(201, json.dumps({**manifest, "size": "1 B", "totalBytes": 1}).encode())

    def _send(self, code: int, data: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def service() -> Iterator[str]:
    Service.promotions = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Service)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def trainingrun() -> dict[str, Any]:
    return (
        TrainingRunBuilder("birds", "team")
        .nodes(2)
        .with_("metadata.uid", "uid-1")
        .register("birds")
        .obj()
    )


def test_promote_sends_the_run_path_and_metadata_and_says_why_not(service: str) -> None:
    client = RegistryClient(service, "tok")
    manifest = client.promote("team", "birds", "birds", "outputs/model.pt", {"mode": "local"})
    assert manifest["version"] == 4
    [(path, body, auth)] = Service.promotions
    assert path == "/v1/namespaces/team/models/birds/versions"
    assert body == {"run": "birds", "path": "outputs/model.pt", "metadata": {"mode": "local"}}
    assert auth == "Bearer tok"
    with pytest.raises(RegistryError, match="not an allowed key") as refused:
        client.promote("team", "birds", "birds", "outputs", {"evil": 1})
    assert refused.value.status == 400
    closed = RegistryClient("http://127.0.0.1:9", "tok")
    with pytest.raises(RegistryError, match="is not reachable") as unreachable:
        closed.promote("team", "birds", "birds", "outputs", {})
    assert unreachable.value.status is None


def test_the_operator_promotes_with_the_one_metadata(service: str, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("operator-token\n")
    run = api.parse_trainingrun(trainingrun())
    env = {"status": {"image": IMAGE}}
    fake = FakeK8s()
    ctx = context.Context(
        settings=pods.Settings(registry_url=service, registry_token_file=str(token)), k8s=fake
    )
    done = finalize.register(run, env, ctx, logging.getLogger("test"))
    assert done == finalize.Registration({"name": "birds", "version": 4})
    [(_, body, auth)] = Service.promotions
    assert body["metadata"] == models.promote_metadata(run, image=IMAGE)
    assert auth == "Bearer operator-token"
    assert fake.get(k8s.MODELVERSIONS, "team", "birds-v4")["spec"]["environmentImage"] == IMAGE


def test_the_sdk_registers_with_the_one_metadata_framework_included(
    service: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = trainingrun()
    body["status"] = {"phase": "Succeeded"}
    fake = FakeK8s({**body, "status": {}})
    monkeypatch.setattr(runs, "get", lambda ns, name: body)
    monkeypatch.setattr(k8s, "get_or_none", lambda *a: {"status": {"image": IMAGE}})
    monkeypatch.setattr(k8s, "apply", lambda manifest, **kw: fake.apply(manifest))
    monkeypatch.setattr(k8s, "apply_status", lambda manifest, **kw: fake.apply_status(manifest))
    ws = Workspace(namespace="team")
    monkeypatch.setattr(Workspace, "registry", lambda self: RegistryClient(service, "user"))
    run = Run(Experiment(ws, "birds"), "birds")
    model = run.register_model(
        "birds", "outputs/model.pt", tags={"stage": "dev"}, model_framework="PyTorch"
    )
    assert model.version == 4
    [(_, sent, _)] = Service.promotions
    assert sent["path"] == "outputs/model.pt"
    assert sent["metadata"] == models.promote_metadata(
        api.parse_trainingrun(body),
        image=IMAGE,
        tags={"stage": "dev"},
        properties={},
        description="",
        framework=models.Framework(name="PyTorch", version=""),
    )
    [mv_status] = [s for s in fake.statuses if s["kind"] == "ModelVersion"]
    assert mv_status["metadata"] == {"name": "birds-v4", "namespace": "team"}

    monkeypatch.setattr(Workspace, "registry", lambda self: RegistryClient("http://127.0.0.1:9"))
    with pytest.raises(TorchyardSdkError, match=r"cannot register birds: .* not reachable"):
        run.register_model("birds")


def test_local_mode_publishes_the_one_metadata(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(
        "import json, os\nos.makedirs('outputs', exist_ok=True)\n"
        "open('outputs/model.pt', 'w').write('w')\n"
        "json.dump({'loss': 0.25, 'note': 'x'}, open('outputs/metrics.json', 'w'))\n"
    )
    run = api.parse_trainingrun(trainingrun())
    env = api.parse_environment(
        {"apiVersion": api.API_VERSION, "kind": "Environment", "metadata": {"name": "pytorch"},
         "spec": {"image": "python:3.11-slim"}}
    )  # fmt: skip
    result = local.run_local(
        run,
        src,
        ["train.py"],
        registry=tmp_path / "registry",
        workroot=tmp_path / "runs",
        environment=env,
        out=io.StringIO(),
    )
    assert result.succeeded and result.model is not None
    manifest = Store(tmp_path / "registry").get("team", "birds").manifest
    expected = models.promote_metadata(
        run, image="python:3.11-slim", metrics={"loss": 0.25}, local=True
    )
    assert {k: manifest[k] for k in expected} == expected
