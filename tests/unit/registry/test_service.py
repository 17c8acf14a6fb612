"""The registry service's routes, served for real over HTTP on loopback, with a stand-in
for its Authorizer (torchyard's own protocol: no Kubernetes API here; the same table runs
against TokenReview and SubjectAccessReview in tests/integration/test_registry_service.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.unit.registry import hostile
from torchyard.registry import Store, service
from torchyard.registry.client import TOKEN_HEADER, RegistryClient
from torchyard.registry.service import CachingAuthorizer, Limits, RunIdentity
from torchyard.registry.store import TMP_PREFIX

A, B = "team-a", "team-b"
WRITER = f"system:serviceaccount:{A}:trainer"  # the node Pods of a's runs
NEIGHBOUR = f"system:serviceaccount:{A}:other"  # another Pod of namespace a
USER = "alice"  # a person with create on modelversions in a
OPERATOR = "system:serviceaccount:torchyard-system:operator"  # create on runrecords in a
READER = "bob"  # a person with get, and only get, on modelversions in a


@dataclass
class StandIn:
    """Tokens are the usernames; everyone but the reader may get and create in namespace a
    only, the reader only get; the TrainingRuns of a run as ServiceAccount trainer."""

    runs: dict[str, RunIdentity] = field(
        default_factory=lambda: {
            name: RunIdentity(f"uid-{name}", "trainer") for name in (*hostile.RUNS, "r")
        }
    )
    calls: list[tuple[str, ...]] = field(default_factory=list)

    def user(self, token: str) -> dict[str, Any] | None:
        self.calls.append(("user", token))
        return {"username": token} if token in (WRITER, NEIGHBOUR, USER, OPERATOR, READER) else None

    def allowed(
        self, user: dict[str, Any], verb: str, namespace: str, resource: str = "modelversions"
    ) -> bool:
        self.calls.append(("allowed", user["username"], verb, namespace))
        if resource == "runrecords":  # only the operator writes records
            return namespace == A and user["username"] == OPERATOR
        return namespace == A and (verb == "get" or user["username"] != READER)

    def training_run(self, namespace: str, name: str) -> RunIdentity | None:
        self.calls.append(("training_run", namespace, name))
        return self.runs.get(name) if namespace == A else None


class Served:
    """``service.create_app`` on a loopback port, in a thread with its own event loop."""

    def __init__(self, root: Path, authorizer: service.Authorizer, limits: Limits) -> None:
        self.root = root
        self.loop = asyncio.new_event_loop()
        app = service.create_app(Store(root), authorizer, limits)
        self.runner = web.AppRunner(app, access_log=None)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = self.runner.addresses[0][1]
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def call(
        self,
        method: str,
        path: str,
        token: str = WRITER,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(
                method,
                path,
                body=body,
                headers={"Authorization": f"Bearer {token}", **(headers or {})},
            )
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def promote(self, body: dict[str, Any], token: str = USER, model: str = "m") -> Any:
        code, raw = self.call(
            "POST",
            f"/v1/namespaces/{A}/models/{model}/versions",
            token,
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        return code, json.loads(raw) if raw.startswith(b"{") else raw.decode()


@pytest.fixture
def stand_in() -> StandIn:
    return StandIn()


@pytest.fixture
def served(tmp_path: Path, stand_in: StandIn) -> Iterator[Served]:
    svc = Served(tmp_path / "registry", stand_in, Limits(upload_bytes=1000, snapshot_bytes=500))
    yield svc
    svc.stop()


def put(svc: Served, run: str, path: str, data: bytes, token: str = WRITER) -> tuple[int, bytes]:
    return svc.call("PUT", f"/v1/namespaces/{A}/runs/{run}/outputs/{path}", token, data)


# -- every path variable of every route, in one place ------------------------------------


def test_no_variable_of_any_route_reaches_another_namespace(served: Served) -> None:
    planted = hostile.plant(served.root, A, B)
    # The setup is sound: namespace a's own model and archive are served.
    assert served.call("GET", f"/v1/namespaces/{A}/models/own/versions/1/files/model.pt") == (
        200,
        hostile.OWN,
    )
    assert served.call("GET", f"/v1/namespaces/{A}/runs/own/outputs/model.pt") == (200, hostile.OWN)
    table = hostile.cases(planted)
    assert len(table) > 250
    for case in table:
        status, response = hostile.raw_request("127.0.0.1", served.port, case, WRITER)
        assert status in (400, 404), f"{case}: {status} {response[-300:]!r}"
        assert hostile.SECRET not in response, f"{case} leaked namespace b's secret"
    assert planted.outside_a() == planted.before, "a request wrote outside namespace a"
    code, body = served.call("GET", f"/v1/namespaces/{A}/models")
    assert code == 200 and "linked" not in json.loads(body)["models"]


def test_a_caller_allowed_in_one_namespace_gets_403_on_every_route_of_another(
    served: Served,
) -> None:
    """Well-formed requests for what namespace b really holds, with a valid token of a
    caller allowed in a only: the namespace check alone decides."""
    planted = hostile.plant(served.root, A, B)
    valid = {"ns": B, "run": "secret", "kind": "outputs", "path": "model.pt"}
    valid |= {"model": "secret", "v": "1", "sha": planted.sha_b}
    valid |= {"kinds": "trainingruns", "name": "secret", "uid": hostile.UID_B}
    for token in (WRITER, USER, OPERATOR):
        for method, template in hostile.ROUTES:
            path = template.format(**valid)
            body = b'{"run": "secret"}' if template.endswith("/versions") else hostile.SECRET
            code, response = served.call(method, path, token, body)
            assert code == 403, f"{method} {path}: {code} {response[-300:]!r}"
            assert hostile.SECRET not in response
            assert method == "HEAD" or b"may not" in response  # HEAD: no body
    assert planted.outside_a() == planted.before, "a request wrote into namespace b"
    # The same caller reads namespace a's own: the token and the routes were sound.
    assert served.call("GET", f"/v1/namespaces/{A}/runs/own/outputs/model.pt") == (200, hostile.OWN)


@pytest.mark.parametrize(
    ("path", "says"),
    [
        (f"/v1/namespaces/{A}/models/..%2F..%2F{B}%2Fmodels%2Fsecret/versions/1/files/m", "model"),
        (f"/v1/namespaces/{A}/runs/own/outputs/..%2F..%2F..%2F..%2F{B}%2Fx", "file path"),
        (f"/v1/namespaces/{A}/runs/own/outputs/a%00b", "control character"),
        (f"/v1/namespaces/{A}/models/own/versions/01", "version"),
        (f"/v1/namespaces/{'n' * 64}/models", "namespace"),
    ],
)
def test_a_refused_variable_is_named_with_its_rule(served: Served, path: str, says: str) -> None:
    code, body = served.call("GET", path)
    assert code == 400 and says in body.decode()


def test_a_route_whose_variable_has_no_rule_is_refused_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(service.VARIABLES, "sha")
    with pytest.raises(RuntimeError, match="sha"):
        service.create_app(Store(tmp_path), StandIn())


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("model.pt", True),
        ("sub/dir/model.pt", True),
        ("..", False),
        ("a/../b", False),
        ("./a", False),
        ("/etc/passwd", False),
        ("a//b", False),
        ("a/", False),
        ("a\\b", False),
        ("a\x00b", False),
        ("a\nb", False),
        ("x" * 256, False),
        ("x" * 255, True),
        ("d/" * 600, False),
        (".tmp-upload-1", False),
        ("a\udcffb", False),
        ("", False),
    ],
)
def test_file_path_rule(value: str, ok: bool) -> None:
    assert (service.path_problem(value) is None) is ok


# -- who may call at all, and read or write -----------------------------------------------


def test_a_caller_without_a_valid_token_gets_401_asking_for_a_bearer_token(
    served: Served,
) -> None:
    path = f"/v1/namespaces/{A}/models"
    for headers, says in [
        ({}, "a Kubernetes bearer token is required"),
        ({"Authorization": "Basic dXNlcg=="}, "a Kubernetes bearer token is required"),
        ({"Authorization": "Bearer nobody"}, "the token is not valid for the registry"),
    ]:
        conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
        try:
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            assert (resp.status, resp.read().decode()) == (401, says)
            assert resp.getheader("WWW-Authenticate") == "Bearer"
        finally:
            conn.close()


def test_the_token_header_of_the_apiserver_proxy_is_read_when_there_is_no_bearer(
    served: Served,
) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    try:
        conn.request("GET", f"/v1/namespaces/{A}/models", headers={TOKEN_HEADER: f" {USER} "})
        assert conn.getresponse().status == 200
    finally:
        conn.close()


def test_a_reader_reads_but_may_not_write_or_promote(served: Served, stand_in: StandIn) -> None:
    assert put(served, "r", "model.pt", b"w")[0] == 201
    assert served.call("GET", f"/v1/namespaces/{A}/runs/r/outputs/model.pt", READER) == (200, b"w")
    assert ("allowed", READER, "get", A) in stand_in.calls
    said = f"{READER} may not create modelversions in {A}".encode()
    assert put(served, "r", "model.pt", b"x", token=READER) == (403, said)
    assert served.promote({"run": "r"}, token=READER) == (403, said.decode())
    assert (served.root / A / "runs/r/outputs/model.pt").read_bytes() == b"w"


def test_a_reader_lists_and_downloads_a_run_and_its_snapshots_but_stores_none(
    served: Served,
) -> None:
    assert put(served, "r", "model.pt", b"w")[0] == 201
    data = b"a snapshot"
    sha = hashlib.sha256(data).hexdigest()
    snapshot = f"/v1/namespaces/{A}/snapshots/{sha}"
    assert served.call("PUT", snapshot, READER, data) == (
        403,
        f"{READER} may not create modelversions in {A}".encode(),
    )
    assert not (served.root / A / "snapshots").exists()
    assert served.call("PUT", snapshot, USER, data) == (
        201,
        json.dumps({"sha256": sha, "size": len(data)}).encode(),
    )
    # stored once: the same again is answered from what is there
    assert served.call("PUT", snapshot, USER, data) == (
        200,
        json.dumps({"sha256": sha, "size": len(data)}).encode(),
    )
    assert served.call("GET", snapshot, READER) == (200, data)
    assert served.call("GET", f"/v1/namespaces/{A}/runs/r", READER) == (
        200,
        json.dumps(
            {
                "files": ["outputs/model.pt"],
                "entries": [{"path": "outputs/model.pt", "size": 1}],
                "owner": "uid-r",  # the run the archive is of
            }
        ).encode(),
    )


def test_a_runs_listing_names_its_files_but_no_link_temporary_or_folder(served: Served) -> None:
    assert put(served, "r", "model.pt", b"w")[0] == 201
    assert put(served, "r", "sub/deep.pt", b"d")[0] == 201
    outputs = served.root / A / "runs" / "r" / "outputs"
    (outputs / "linked.pt").symlink_to(outputs / "model.pt")
    (outputs / f"{TMP_PREFIX}upload-abc").write_bytes(b"half")
    (outputs / "empty").mkdir()
    code, body = served.call("GET", f"/v1/namespaces/{A}/runs/r")
    assert (code, json.loads(body)) == (
        200,
        {
            "files": ["outputs/model.pt", "outputs/sub/deep.pt"],
            "entries": [
                {"path": "outputs/model.pt", "size": 1},
                {"path": "outputs/sub/deep.pt", "size": 1},
            ],
            "owner": "uid-r",
        },
    )
    assert served.call("GET", f"/v1/namespaces/{A}/runs/none") == (
        404,
        b"no such run in the registry",
    )


def test_an_upload_answers_what_it_stored_and_a_path_that_is_a_folder_conflicts(
    served: Served,
) -> None:
    sha = hashlib.sha256(b"w").hexdigest()
    assert put(served, "r", "a/model.pt", b"w") == (
        201,
        json.dumps({"path": "a/model.pt", "size": 1, "sha256": sha}).encode(),
    )
    assert put(served, "r", "a", b"x") == (409, b"a is a folder in the archive")
    assert put(served, "r", "a/model.pt/x", b"x") == (
        409,
        b"a folder of a/model.pt/x is a file in the archive",
    )
    path = f"/v1/namespaces/{A}/runs/r/outputs/late.pt"
    code, body = served.call("PUT", path + "?commit=later", WRITER, b"late")
    assert code == 202
    upload = json.loads(body)["upload"]
    late = hashlib.sha256(b"late").hexdigest()
    assert served.call(
        "POST", f"{path}?upload={upload}", WRITER, b"", {"X-Content-SHA256": late}
    ) == (
        201,
        json.dumps({"path": "late.pt", "size": 4, "sha256": late}).encode(),
    )
    assert served.call(
        "POST", f"{path}?upload={upload}", WRITER, b"", {"X-Content-SHA256": late}
    ) == (
        404,
        b"no such pending upload (expired or restarted): upload again",
    )


def test_a_body_whose_sha256_is_not_the_one_announced_is_refused_and_not_kept(
    served: Served,
) -> None:
    got = hashlib.sha256(b"w").hexdigest()
    wrong = {"X-Content-SHA256": "0" * 64}
    path = f"/v1/namespaces/{A}/runs/r/outputs/model.pt"
    assert served.call("PUT", path, WRITER, b"w", wrong) == (
        400,
        f"sha256 mismatch: got {got}".encode(),
    )
    # two uploads wait for their commits at once; a wrong digest drops the one it names
    first = json.loads(served.call("PUT", path + "?commit=later", WRITER, b"w")[1])["upload"]
    other = f"/v1/namespaces/{A}/runs/r/outputs/other.pt"
    second = json.loads(served.call("PUT", other + "?commit=later", WRITER, b"o")[1])["upload"]
    assert served.call("POST", f"{path}?upload={first}", WRITER, b"", wrong) == (
        400,
        f"sha256 mismatch: the service got {got}".encode(),
    )
    right = {"X-Content-SHA256": hashlib.sha256(b"o").hexdigest()}
    assert served.call("POST", f"{other}?upload={second}", WRITER, b"", right)[0] == 201
    assert sorted(p.name for p in (served.root / A / "runs/r/outputs").iterdir()) == ["other.pt"]
    # a snapshot is stored under its own digest only, beside the others
    for data in (b"one", b"two"):
        sha = hashlib.sha256(data).hexdigest()
        assert served.call("PUT", f"/v1/namespaces/{A}/snapshots/{sha}", USER, data)[0] == 201
    assert served.call("PUT", f"/v1/namespaces/{A}/snapshots/{'0' * 64}", USER, b"x") == (
        400,
        f"sha256 mismatch: the body's is {hashlib.sha256(b'x').hexdigest()}".encode(),
    )
    assert len(list((served.root / A / "snapshots").iterdir())) == 2


# -- a run's archive is written by that run's ServiceAccount only ------------------------


def test_only_the_runs_service_account_writes_its_archive(served: Served) -> None:
    assert put(served, "r", "model.pt", b"w")[0] == 201
    code, body = put(served, "r", "model.pt", b"x", token=NEIGHBOUR)
    assert code == 403 and b"only its node Pods may, as ServiceAccount trainer" in body
    code, body = put(served, "r", "model.pt", b"x", token=USER)
    assert code == 403
    code, body = put(served, "no-such-run", "model.pt", b"x")
    assert code == 404 and b"there is no TrainingRun no-such-run" in body
    # The one-pass commit is a write too.
    path = f"/v1/namespaces/{A}/runs/r/outputs/late.pt"
    code, body = served.call("PUT", path + "?commit=later", WRITER, b"late")
    assert code == 202
    upload = json.loads(body)["upload"]
    sha = {"X-Content-SHA256": hashlib.sha256(b"late").hexdigest()}
    assert served.call("POST", f"{path}?upload={upload}", NEIGHBOUR, b"", sha)[0] == 403
    assert served.call("POST", f"{path}?upload={upload}", WRITER, b"", sha)[0] == 201
    assert (served.root / A / "runs/r/outputs/model.pt").read_bytes() == b"w"
    # Reading and promoting stay open to anyone allowed in the namespace.
    assert served.call("GET", f"/v1/namespaces/{A}/runs/r/outputs/model.pt", USER) == (200, b"w")
    assert served.promote({"run": "r"}, token=USER)[0] == 201


def test_a_later_run_of_the_same_name_gets_an_archive_of_its_own_and_the_earlier_is_kept(
    served: Served, stand_in: StandIn
) -> None:
    """A TrainingRun deleted and created again under its name (another uid) never writes
    into the earlier run's archive: a ModelVersion of the new run would take the old
    run's outputs. The earlier archive moves, whole, to runs/<name>@<its uid>."""
    assert put(served, "r", "old-only.pt", b"old")[0] == 201
    assert put(served, "r", "model.pt", b"v1")[0] == 201
    assert put(served, "r", "model.pt", b"v1 again")[0] == 201  # the same run: same folder
    stand_in.runs["r"] = RunIdentity("uid-r-2", "trainer")
    assert put(served, "r", "model.pt", b"v2")[0] == 201
    code, body = served.call("GET", f"/v1/namespaces/{A}/runs/r")
    assert (code, json.loads(body)["files"]) == (200, ["outputs/model.pt"])
    assert served.call("GET", f"/v1/namespaces/{A}/runs/r/outputs/model.pt") == (200, b"v2")
    earlier = served.root / A / "runs" / "r@uid-r"
    assert (earlier / "outputs/old-only.pt").read_bytes() == b"old"
    assert (earlier / "outputs/model.pt").read_bytes() == b"v1 again"
    assert served.promote({"run": "r"}, token=USER)[0] == 201  # from the new run's files only
    manifest = json.loads(next((served.root / A / "models").glob("*/1/*.json")).read_text())
    assert "old-only.pt" not in json.dumps(manifest)
    # A reader asks for one run's archive by its uid, wherever it is now.
    runs = f"/v1/namespaces/{A}/runs/r"
    for uid, files, model in (
        ("uid-r", ["outputs/model.pt", "outputs/old-only.pt"], b"v1 again"),
        ("uid-r-2", ["outputs/model.pt"], b"v2"),
    ):
        code, body = served.call("GET", f"{runs}?uid={uid}", READER)
        assert (code, json.loads(body)["files"], json.loads(body)["owner"]) == (200, files, uid)
        assert served.call("GET", f"{runs}/outputs/model.pt?uid={uid}", READER) == (200, model)
    client = RegistryClient(f"http://127.0.0.1:{served.port}", READER)
    assert client.run_archive(A, "r", "uid-r") == (
        [("outputs/model.pt", 8), ("outputs/old-only.pt", 3)],
        "uid-r",
    )
    assert client.read_run_file(A, "r", "outputs/model.pt", "uid-r") == "v1 again"
    assert client.read_run_file(A, "r", "outputs/model.pt") == "v2"  # the name's, as it is now
    code, text = served.call("GET", f"{runs}?uid=uid-never", READER)
    assert code == 404 and b"no archive of run r with uid uid-never" in text
    assert served.call("GET", f"{runs}/outputs/model.pt?uid=uid-never", READER)[0] == 404


def test_the_authorizers_caches_are_bounded_and_expire() -> None:
    inner = StandIn(runs={f"r{i}": RunIdentity(str(i), "trainer") for i in range(50)})
    cached = CachingAuthorizer(inner, ttl=60, size=8)
    for i in range(50):
        cached.user(f"token-{i}")
        cached.allowed({"username": f"u{i}"}, "get", A)
        assert cached.training_run(A, f"r{i}") == RunIdentity(str(i), "trainer")
    assert (len(cached._users), len(cached._decisions), len(cached._runs)) == (8, 8, 8)
    calls = len(inner.calls)
    assert cached.training_run(A, "r49") == RunIdentity("49", "trainer")  # recent: cached
    assert len(inner.calls) == calls
    assert cached.training_run(A, "r0") == RunIdentity("0", "trainer")  # evicted: asked again
    assert len(inner.calls) == calls + 1
    # "No such run" is not remembered: the run may be created a moment later.
    assert cached.training_run(A, "later") is None
    inner.runs["later"] = RunIdentity("new", "trainer")
    assert cached.training_run(A, "later") == RunIdentity("new", "trainer")

    short = CachingAuthorizer(inner, ttl=0.05, size=8)
    short.user(WRITER)
    time.sleep(0.1)  # the entry's lifetime, not a race: nothing else runs
    short.user(USER)  # a put drops what expired
    assert len(short._users) == 1
    short.user(USER)
    assert inner.calls.count(("user", USER)) == 1


# -- the manifest's own keys are the server's --------------------------------------------


def test_caller_metadata_cannot_replace_the_file_list(served: Served) -> None:
    assert put(served, "r", "model.pt", b"real weights")[0] == 201
    fake = [{"path": "model.pt", "size": 1, "sha256": "0" * 64}]
    for key, value in (("files", fake), ("totalBytes", 1), ("version", 99), ("model", "x")):
        code, text = served.promote({"run": "r", "metadata": {key: value}})
        assert code == 400 and repr(key) in text and "registry's own" in text
    code, text = served.promote({"run": "r", "metadata": {"evil": 1}})
    assert code == 400 and "'evil'" in text and "allowed:" in text
    code, text = served.promote({"run": "r", "metadata": {"run": {"name": "other"}}})
    assert code == 400 and "run.name" in text
    code, manifest = served.promote(
        {"run": "r", "metadata": {"run": {"name": "r", "uid": "uid-r"}, "tags": {"a": "b"}}}
    )
    assert code == 201
    assert manifest["files"] == [
        {"path": "model.pt", "size": 12, "sha256": hashlib.sha256(b"real weights").hexdigest()}
    ]
    assert (manifest["model"], manifest["namespace"], manifest["version"]) == ("m", A, 1)
    assert manifest["run"] == {"name": "r", "uid": "uid-r"} and manifest["tags"] == {"a": "b"}


def test_concurrent_promotions_of_one_run_make_one_version(served: Served) -> None:
    assert put(served, "r", "model.pt", b"w" * 900)[0] == 201
    body = {"run": "r", "metadata": {"run": {"name": "r", "uid": "uid-r"}}}
    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(lambda _: served.promote(body), range(12)))
    assert sorted(code for code, _ in results) == [200] * 11 + [201]
    assert {m["version"] for _, m in results} == {1}
    assert Store(served.root).versions(A, "m") == [1]
    # The uid must be the TrainingRun's: another uid cannot claim (or shadow) it.
    code, text = served.promote({"run": "r", "metadata": {"run": {"uid": "uid-own"}}})
    assert code == 409 and "not the uid of TrainingRun" in text


# -- size limits -------------------------------------------------------------------------


def test_an_upload_over_the_limit_is_413_and_leaves_nothing(served: Served) -> None:
    code, body = put(served, "r", "big.pt", b"x" * 1001)  # Content-Length: refused up front
    assert code == 413 and b"--max-upload-bytes" in body and b"registry.maxUploadBytes" in body
    # A chunked body has no length to check up front: counted while it streams.
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    conn.request(
        "PUT",
        f"/v1/namespaces/{A}/runs/r/outputs/chunked.pt",
        body=iter([b"y" * 400] * 5),
        headers={"Authorization": f"Bearer {WRITER}"},
        encode_chunked=True,
    )
    resp = conn.getresponse()
    assert resp.status == 413 and b"1000 bytes" in resp.read()
    conn.close()
    outputs = served.root / A / "runs/r/outputs"
    assert not outputs.exists() or list(outputs.iterdir()) == []
    assert put(served, "r", "fits.pt", b"x" * 1000)[0] == 201


def test_a_snapshot_over_the_limit_is_413(served: Served) -> None:
    data = b"s" * 501
    sha = hashlib.sha256(data).hexdigest()
    code, body = served.call("PUT", f"/v1/namespaces/{A}/snapshots/{sha}", USER, data)
    assert code == 413 and b"--max-snapshot-bytes" in body and b"registry.maxSnapshotBytes" in body
    assert not list((served.root / A).rglob("*.tar.gz"))
    small = b"s" * 500
    small_sha = hashlib.sha256(small).hexdigest()
    assert served.call("PUT", f"/v1/namespaces/{A}/snapshots/{small_sha}", USER, small)[0] == 201


def test_a_promotion_body_over_a_mebibyte_is_413(served: Served) -> None:
    code, text = served.promote({"run": "r", "metadata": {"description": "d" * (1 << 20)}})
    assert code == 413 and "at most" in text
