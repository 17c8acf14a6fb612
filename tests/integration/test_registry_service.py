"""The registry service as a local process against the real control plane: tokens are
checked with a real TokenReview and requests with a real SubjectAccessReview."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.builders import role_binding
from tests.cluster.harness import Cluster, free_port
from tests.integration.helpers import sample, scrape
from torchyard import k8s
from torchyard.cli import AUDIENCE, KubernetesAuthorizer
from torchyard.launcher import upload_file
from torchyard.registry import Store, service


class Service:
    def __init__(self, root: Path, host: str = "127.0.0.1") -> None:
        self.root = root
        self.host = host
        self.port = free_port()
        self.url = f"http://{host}:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = service.create_app(Store(self.root), KubernetesAuthorizer())
        self.runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self.runner.setup())
        self._loop.run_until_complete(web.TCPSite(self.runner, self.host, self.port).start())
        self._ready.set()
        self._loop.run_forever()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def call(
        self,
        method: str,
        path: str,
        token: str | None = None,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()


@pytest.fixture
def registry(tmp_path: Path, cluster: Cluster) -> Iterator[Service]:
    svc = Service(tmp_path / "registry")
    yield svc
    svc.stop()


def trainer_token(namespace: str) -> str:
    """A token of a ServiceAccount allowed to read and write modelversions in namespace."""
    k8s.create(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "trainer", "namespace": namespace},
        }
    )
    k8s.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "models", "namespace": namespace},
            "rules": [
                {
                    "apiGroups": ["torchyard.dev"],
                    "resources": ["modelversions"],
                    "verbs": ["get", "list", "create"],
                }
            ],
        }
    )
    k8s.create(role_binding(namespace, "trainer-models", "models", "trainer"))
    return k8s.request_token(namespace, "trainer", [AUDIENCE])


def upload(svc: Service, token: str, ns: str, run: str, path: str, data: bytes) -> Any:
    return svc.call(
        "PUT",
        f"/v1/namespaces/{ns}/runs/{run}/outputs/{path}",
        token,
        data,
        {"X-Content-SHA256": hashlib.sha256(data).hexdigest()},
    )


def test_upload_promote_list_and_ranged_download(registry: Service, namespace: str) -> None:
    token = trainer_token(namespace)
    weights = bytes(range(256)) * 4096  # 1 MiB
    code, _ = upload(registry, token, namespace, "birds", "model.pt", weights)
    assert code == 201
    code, _ = registry.call(
        "POST",
        f"/v1/namespaces/{namespace}/models/birds/versions",
        token,
        b'{"run": "birds", "path": "outputs"}',
        {"Content-Type": "application/json"},
    )
    assert code == 201
    code, body = registry.call("GET", f"/v1/namespaces/{namespace}/models", token)
    assert (code, body) == (200, b'{"models": {"birds": [1]}}')
    code, body = registry.call(
        "GET",
        f"/v1/namespaces/{namespace}/models/birds/versions/1/files/model.pt",
        token,
        headers={"Range": "bytes=1000-1999"},
    )
    assert code == 206 and body == weights[1000:2000]
    code, body = registry.call(
        "GET", f"/v1/namespaces/{namespace}/models/birds/versions/1/files/model.pt", token
    )
    assert hashlib.sha256(body).hexdigest() == hashlib.sha256(weights).hexdigest()


def test_metrics_count_the_bytes_of_files_in_and_out(registry: Service, namespace: str) -> None:
    token = trainer_token(namespace)
    url = f"{registry.url}/metrics"  # no token: counters only
    before = scrape(url)
    assert sample(before, "torchyard_registry_received_bytes_total") == 0
    assert sample(before, "torchyard_registry_sent_bytes_total") == 0
    weights = b"w" * 300_000
    assert upload(registry, token, namespace, "r", "model.pt", weights)[0] == 201
    path = f"/v1/namespaces/{namespace}/runs/r/outputs/model.pt"
    code, body = registry.call("GET", path, token, headers={"Range": "bytes=0-999"})
    assert (code, len(body)) == (206, 1000)
    assert registry.call("GET", path, token) == (200, weights)
    assert registry.call("GET", f"/v1/namespaces/{namespace}/models", token)[0] == 200
    after = scrape(url)
    assert sample(after, "torchyard_registry_received_bytes_total") == len(weights)
    assert sample(after, "torchyard_registry_sent_bytes_total") == 1000 + len(weights)


def test_a_corrupted_upload_is_refused(registry: Service, namespace: str) -> None:
    token = trainer_token(namespace)
    code, body = registry.call(
        "PUT",
        f"/v1/namespaces/{namespace}/runs/r/outputs/m.pt",
        token,
        b"data",
        {"X-Content-SHA256": "0" * 64},
    )
    assert code == 400 and b"sha256 mismatch" in body
    assert not list((registry.root / namespace / "runs" / "r" / "outputs").glob("*"))


def test_no_token_is_401_and_another_namespace_is_403(
    registry: Service, namespace: str, cluster: Cluster
) -> None:
    token = trainer_token(namespace)
    other = cluster.create_namespace(namespace[:50] + "-b")
    try:
        assert registry.call("GET", f"/v1/namespaces/{namespace}/models")[0] == 401
        assert registry.call("GET", f"/v1/namespaces/{namespace}/models", "not-a-token")[0] == 401
        code, body = upload(registry, token, other, "r", "m.pt", b"x")
        assert code == 403 and b"may not create modelversions" in body
        assert registry.call("GET", f"/v1/namespaces/{other}/models", token)[0] == 403
    finally:
        cluster.delete_namespace(other)


def test_twenty_concurrent_promotions_get_versions_1_to_20(
    registry: Service, namespace: str
) -> None:
    token = trainer_token(namespace)
    assert upload(registry, token, namespace, "run", "model.pt", b"w" * 100_000)[0] == 201

    def promote(_: int) -> int:
        return registry.call(
            "POST",
            f"/v1/namespaces/{namespace}/models/m/versions",
            token,
            b'{"run": "run"}',
            {"Content-Type": "application/json"},
        )[0]

    with ThreadPoolExecutor(20) as pool:
        assert set(pool.map(promote, range(20))) == {201}
    store = Store(registry.root)
    assert store.versions(namespace, "m") == list(range(1, 21))
    assert all(store.verify(store.get(namespace, "m", v)) == [] for v in range(1, 21))


def test_killing_the_service_mid_upload_leaves_nothing_partial(
    tmp_path: Path, namespace: str, cluster: Cluster
) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    root = tmp_path / "registry"
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "torchyard",
        "registry",
        "serve",
        "--root",
        str(root),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig))

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).close()
                return proc
            except OSError:
                time.sleep(0.05)
        raise AssertionError("the registry service did not start")

    token = trainer_token(namespace)
    svc = Service.__new__(Service)
    svc.url = f"http://127.0.0.1:{port}"
    proc = start()
    blobs = {f"part-{i}.bin": os.urandom(1 << 20) * 16 for i in range(20)}  # 20 x 16 MiB

    def send(name: str) -> int:
        try:
            return int(upload(svc, token, namespace, "big", name, blobs[name])[0])
        except OSError:
            return 0  # the connection died with the service

    with ThreadPoolExecutor(20) as pool:
        futures = [pool.submit(send, name) for name in blobs]
        time.sleep(0.5)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        results = [f.result() for f in futures]
    assert 0 in results, "the kill came too late to interrupt any upload"
    proc = start()
    try:
        outputs = root / namespace / "runs" / "big" / "outputs"
        visible = sorted(p.name for p in outputs.iterdir()) if outputs.exists() else []
        for name in visible:
            data = (outputs / name).read_bytes()
            assert data == blobs[name], f"{name} is partial"
        assert not [p for p in root.rglob("*") if p.name.startswith(".tmp-")]
        # What did land can be promoted, and the store verifies.
        if visible:
            code, _ = svc.call(
                "POST",
                f"/v1/namespaces/{namespace}/models/big/versions",
                token,
                b'{"run": "big"}',
                {"Content-Type": "application/json"},
            )
            assert code == 201
            store = Store(root)
            assert store.verify(store.get(namespace, "big")) == []
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


def test_one_pass_upload_is_invisible_until_its_digest_is_confirmed(
    registry: Service, namespace: str
) -> None:
    token = trainer_token(namespace)
    path = f"/v1/namespaces/{namespace}/runs/r/outputs/model.pt"
    data = b"x" * 300_000
    code, body = registry.call("PUT", path + "?commit=later", token, data)
    assert code == 202
    sent = json.loads(body)
    assert sent["sha256"] == hashlib.sha256(data).hexdigest() and sent["size"] == len(data)
    assert registry.call("GET", path, token)[0] == 404  # not visible yet
    # A wrong digest drops the upload; the right one can no longer commit it.
    code, _ = registry.call(
        "POST", f"{path}?upload={sent['upload']}", token, b"", {"X-Content-SHA256": "0" * 64}
    )
    assert code == 400
    code, _ = registry.call(
        "POST", f"{path}?upload={sent['upload']}", token, b"", {"X-Content-SHA256": sent["sha256"]}
    )
    assert code == 404
    assert registry.call("GET", path, token)[0] == 404
    assert not list((registry.root / namespace).rglob(".tmp-*"))
    # The launcher's one-pass upload: visible once confirmed, byte for byte.
    upload_file(registry.url + path, str(_write(registry.root.parent / "m.pt", data)), token)
    assert registry.call("GET", path, token) == (200, data)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
