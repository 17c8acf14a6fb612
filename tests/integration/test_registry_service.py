"""The registry service as a local process against the real control plane: tokens are
checked with a real TokenReview, requests with a real SubjectAccessReview, and a run's
archive is written only by its TrainingRun's ServiceAccount.

``Service``, ``trainer_token`` and ``upload`` are shared with other integration tests
(``conftest.py``, ``test_models_cli.py``, ``test_archiving.py``)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.client
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

from tests.builders import TrainingRunBuilder, role_binding
from tests.cluster.harness import Cluster, free_port
from tests.integration.helpers import sample, scrape
from tests.unit.registry import hostile
from torchyard import k8s
from torchyard.api.wire import REGISTRY_AUDIENCE as AUDIENCE
from torchyard.launch.node_files import upload_file
from torchyard.registry import Store, service
from torchyard.registry.store import TMP_PREFIX
from torchyard.registry_server import kubernetes_authorizer


class Service:
    def __init__(
        self, root: Path, host: str = "127.0.0.1", limits: service.Limits | None = None
    ) -> None:
        self.root = root
        self.host = host
        self.limits = limits
        self.port = free_port()
        self.url = f"http://{host}:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = service.create_app(Store(self.root), kubernetes_authorizer(), self.limits)
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


def service_account_of(token: str) -> str:
    """The ServiceAccount a (JWT) ServiceAccount token belongs to."""
    payload = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return str(claims["sub"]).rsplit(":", 1)[1]


def training_run(namespace: str, run: str, service_account: str) -> None:
    """TrainingRun ``run`` whose node Pods run as ``service_account`` (only they may write
    its archive); an Environment that never exists keeps the operator from starting it."""
    body = TrainingRunBuilder(run, namespace).environment("registry-test-absent").obj()
    body["spec"]["serviceAccountName"] = service_account
    try:
        k8s.create(body)
    except k8s.ApiError as err:
        if not err.conflict:
            raise
        found = k8s.get(k8s.TRAININGRUNS, namespace, run)["spec"].get("serviceAccountName")
        assert found == service_account, f"TrainingRun {run} runs as {found}"


def upload(svc: Service, token: str, ns: str, run: str, path: str, data: bytes) -> Any:
    """Upload as a node Pod of TrainingRun ``run`` (created, running as the token's
    ServiceAccount, unless it exists) would."""
    training_run(ns, run, service_account_of(token))
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


def test_metrics_carry_the_process_and_speak_openmetrics_when_asked(registry: Service) -> None:
    page = scrape(f"{registry.url}/metrics")
    assert sample(page, "process_resident_memory_bytes") > 1 << 20  # this process's RSS
    assert ("process_cpu_seconds_total", frozenset()) in page
    request = urllib.request.Request(
        f"{registry.url}/metrics",
        headers={"Accept": "application/openmetrics-text; version=1.0.0; charset=utf-8"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        text = resp.read().decode()
    assert "# TYPE torchyard_registry_received_bytes counter" in text.splitlines()
    assert text.endswith("# EOF\n")


def test_a_corrupted_upload_is_refused(registry: Service, namespace: str) -> None:
    token = trainer_token(namespace)
    training_run(namespace, "r", "trainer")
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


def half_upload(
    port: int, token: str, ns: str, name: str, data: bytes
) -> http.client.HTTPConnection:
    """A PUT of ``data`` to run ``big``'s outputs that sends half the body, then waits."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.putrequest("PUT", f"/v1/namespaces/{ns}/runs/big/outputs/{name}")
    conn.putheader("Authorization", f"Bearer {token}")
    conn.putheader("X-Content-SHA256", hashlib.sha256(data).hexdigest())
    conn.putheader("Content-Length", str(len(data)))
    conn.endheaders()
    conn.send(data[: len(data) // 2])
    return conn


def test_killing_the_service_mid_upload_leaves_nothing_partial(
    tmp_path: Path, namespace: str, cluster: Cluster
) -> None:
    import os
    import signal
    import subprocess
    import sys

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
        """The service once it answers (its start takes seconds on a loaded machine)."""
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def answers() -> bool:
            assert proc.poll() is None, f"the registry service exited with {proc.returncode}"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).close()
            except OSError:
                return False
            return True

        cluster.wait_for("the registry service to answer", answers, timeout=120)
        return proc

    token = trainer_token(namespace)
    training_run(namespace, "big", service_account_of(token))
    svc = Service.__new__(Service)
    svc.url = f"http://127.0.0.1:{port}"
    proc = start()
    # Two files land whole before the kill; four are cut off half-way: each sends half its
    # body, and the kill comes once the service has written part of every one of them to
    # its temporary files (seen in its own store), so the kill is known to hit them.
    whole = {f"whole-{i}.bin": os.urandom(1 << 20) for i in range(2)}
    halves = {f"half-{i}.bin": os.urandom(1 << 20) * 8 for i in range(4)}
    for name, data in whole.items():
        assert upload(svc, token, namespace, "big", name, data)[0] == 201
    senders = [half_upload(port, token, namespace, name, data) for name, data in halves.items()]

    def written_in_part() -> bool:
        tmp = [p for p in root.rglob(f"{TMP_PREFIX}upload-*") if p.is_file()]
        return len(tmp) == len(halves) and all(p.stat().st_size > 0 for p in tmp)

    cluster.wait_for("the service writing every cut-off upload", written_in_part)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    for sender in senders:
        with pytest.raises(OSError):  # the service died before it answered
            sender.getresponse()
        sender.close()
    proc = start()
    try:
        outputs = root / namespace / "runs" / "big" / "outputs"
        assert sorted(p.name for p in outputs.iterdir()) == sorted(whole)
        assert all((outputs / name).read_bytes() == data for name, data in whole.items())
        assert not [p for p in root.rglob("*") if p.name.startswith(TMP_PREFIX)]
        # What did land can be promoted, and the store verifies.
        code, _ = svc.call(
            "POST",
            f"/v1/namespaces/{namespace}/models/big/versions",
            token,
            b'{"run": "big"}',
            {"Content-Type": "application/json"},
        )
        assert code == 201
        store = Store(root)
        version = store.get(namespace, "big")
        assert store.verify(version) == []
        assert sorted(f["path"] for f in version.manifest["files"]) == sorted(whole)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


def test_one_pass_upload_is_invisible_until_its_digest_is_confirmed(
    registry: Service, namespace: str
) -> None:
    token = trainer_token(namespace)
    training_run(namespace, "r", "trainer")
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


# -- hostile paths: traversal, links, odd names ------------------------------------------


def test_no_path_variable_of_any_route_reaches_another_namespace(
    registry: Service, namespace: str, cluster: Cluster
) -> None:
    """The table of tests/unit/registry/hostile.py through the real service and real
    TokenReview/SubjectAccessReview: the caller may read and write in ``a`` only; ``b``
    holds a secret (a run archive, a model, a snapshot) and ``a`` links into it."""
    token = trainer_token(namespace)
    other = cluster.create_namespace(namespace[:50] + "-b")
    try:
        for run in hostile.RUNS:
            training_run(namespace, run, "trainer")
        linked = k8s.get(k8s.TRAININGRUNS, namespace, "linked")["metadata"]["uid"]
        planted = hostile.plant(registry.root, namespace, other, linked_uid=linked)
        own = f"/v1/namespaces/{namespace}/models/own/versions/1/files/model.pt"
        assert registry.call("GET", own, token) == (200, hostile.OWN)  # the setup is sound
        # Out of the namespace through an encoded '..' in the model name.
        code, body = registry.call(
            "GET",
            f"/v1/namespaces/{namespace}/models/..%2F..%2F{other}%2Fmodels%2Fsecret"
            "/versions/1/files/model.pt",
            token,
        )
        assert code == 400 and hostile.SECRET not in body
        for case in hostile.cases(planted):
            status, response = hostile.raw_request(registry.host, registry.port, case, token)
            assert status in (400, 404), f"{case}: {status} {response[-300:]!r}"
            assert hostile.SECRET not in response, f"{case} leaked namespace b's secret"
        assert planted.outside_a() == planted.before, "a request wrote outside namespace a"
    finally:
        cluster.delete_namespace(other)


def test_only_the_runs_service_account_writes_its_archive(
    registry: Service, namespace: str, cluster: Cluster
) -> None:
    trainer = trainer_token(namespace)
    cluster.wait_for(
        "the default ServiceAccount",
        lambda: k8s.get_or_none(k8s.SERVICEACCOUNTS, namespace, "default") is not None,
    )
    k8s.create(role_binding(namespace, "default-models", "models", "default"))
    default = k8s.request_token(namespace, "default", [AUDIENCE])
    training_run(namespace, "r", "trainer")
    # A run that does not name a ServiceAccount runs as (and is written by) default.
    k8s.create(TrainingRunBuilder("d", namespace).environment("registry-test-absent").obj())

    def put(token: str, run: str) -> tuple[int, bytes]:
        return registry.call(
            "PUT", f"/v1/namespaces/{namespace}/runs/{run}/outputs/m.pt", token, b"w"
        )

    assert put(trainer, "r")[0] == 201
    code, body = put(default, "r")  # allowed to create modelversions, but not r's Pods
    assert code == 403 and b"only its node Pods may, as ServiceAccount trainer" in body
    assert put(default, "d")[0] == 201
    assert put(trainer, "d")[0] == 403
    code, body = put(trainer, "gone")
    assert code == 404 and b"there is no TrainingRun gone" in body
    path = f"/v1/namespaces/{namespace}/runs/r/outputs/later.pt"
    code, body = registry.call("PUT", path + "?commit=later", trainer, b"later")
    assert code == 202
    upload_id, sha = json.loads(body)["upload"], hashlib.sha256(b"later").hexdigest()
    commit = f"{path}?upload={upload_id}"
    assert registry.call("POST", commit, default, b"", {"X-Content-SHA256": sha})[0] == 403
    assert registry.call("POST", commit, trainer, b"", {"X-Content-SHA256": sha})[0] == 201
    # Reading, and promoting (the operator's job), stay with RBAC on modelversions.
    assert registry.call("GET", f"/v1/namespaces/{namespace}/runs/r/outputs/m.pt", default) == (
        200,
        b"w",
    )
    code, _ = registry.call(
        "POST",
        f"/v1/namespaces/{namespace}/models/m/versions",
        default,
        b'{"run": "r"}',
        {"Content-Type": "application/json"},
    )
    assert code == 201


def test_promoting_one_run_at_once_makes_one_version_with_the_servers_manifest(
    registry: Service, namespace: str
) -> None:
    token = trainer_token(namespace)
    weights = b"w" * 100_000
    assert upload(registry, token, namespace, "birds", "model.pt", weights)[0] == 201
    uid = k8s.get(k8s.TRAININGRUNS, namespace, "birds")["metadata"]["uid"]

    def promote(metadata: dict[str, Any]) -> tuple[int, Any]:
        code, body = registry.call(
            "POST",
            f"/v1/namespaces/{namespace}/models/birds/versions",
            token,
            json.dumps({"run": "birds", "metadata": metadata}).encode(),
            {"Content-Type": "application/json"},
        )
        return code, json.loads(body) if body.startswith(b"{") else body.decode()

    fake = [{"path": "model.pt", "size": 3, "sha256": "0" * 64}]
    code, text = promote({"run": {"name": "birds", "uid": uid}, "files": fake})
    assert code == 400 and "'files' is the registry's own key" in text
    code, text = promote({"run": {"name": "birds", "uid": "made-up"}})
    assert code == 409 and f"TrainingRun {namespace}/birds ({uid})" in text
    meta = {"run": {"name": "birds", "uid": uid}, "command": ["python", "train.py"]}
    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(lambda _: promote(meta), range(10)))
    assert sorted(code for code, _ in results) == [200] * 9 + [201]
    assert Store(registry.root).versions(namespace, "birds") == [1]
    manifest = results[0][1]
    assert manifest["run"] == {"name": "birds", "uid": uid}
    assert manifest["files"] == [
        {"path": "model.pt", "size": len(weights), "sha256": hashlib.sha256(weights).hexdigest()}
    ]


def test_serve_limits_uploads_and_snapshots_with_a_clear_413(
    tmp_path: Path, namespace: str, cluster: Cluster
) -> None:
    """``torchyard registry serve --max-upload-bytes/--max-snapshot-bytes`` as the chart
    passes them (quantities), through the CLI."""
    import os
    import subprocess
    import sys

    token = trainer_token(namespace)
    root, port = tmp_path / "registry", free_port()
    argv = [sys.executable, "-m", "torchyard", "registry", "serve", "--root", str(root)]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    argv += ["--max-upload-bytes", "1Ki", "--max-snapshot-bytes", "2Ki"]
    env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig))
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    svc = Service.__new__(Service)
    svc.url = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            try:
                urllib.request.urlopen(f"{svc.url}/healthz", timeout=1).close()
                return True
            except OSError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                return False

        cluster.wait_for("the registry service", up, 30)
        code, body = upload(svc, token, namespace, "r", "big.pt", b"x" * 1025)
        assert code == 413
        assert b"1.0 KiB (1024 bytes)" in body and b"--max-upload-bytes" in body
        assert upload(svc, token, namespace, "r", "fits.pt", b"x" * 1024)[0] == 201
        snapshot = b"s" * 2049
        sha = hashlib.sha256(snapshot).hexdigest()
        code, body = svc.call("PUT", f"/v1/namespaces/{namespace}/snapshots/{sha}", token, snapshot)
        assert code == 413 and b"registry.maxSnapshotBytes" in body
        assert not [p for p in root.rglob("*") if p.name.startswith(".tmp-")]
        assert sorted(p.name for p in (root / namespace / "runs/r/outputs").iterdir()) == [
            "fits.pt"
        ]
    finally:
        proc.terminate()
        proc.wait(10)
