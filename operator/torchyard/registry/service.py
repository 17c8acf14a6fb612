"""The model registry's HTTP service: it owns the registry volume, everything else asks it.

Runs (and users) stream run outputs and logs in, promote a run's outputs to a new model
version, list models and versions, read manifests and stream files back (HTTP Range).
Uploads are written to a temporary file while their sha256 is computed, checked against
``X-Content-SHA256`` when given, fsynced and renamed into place, so a killed service
never leaves a partial file visible. Memory stays flat in the file size.

Every request carries a Kubernetes bearer token (``Authorization: Bearer``, or
``X-Torchyard-Token`` through the apiserver's service proxy); an :class:`Authorizer` (TokenReview +
SubjectAccessReview, from ``torchyard.k8s``, wired by ``torchyard registry serve``)
decides: no or bad token -> 401; not allowed in that namespace -> 403. Uploading and
promoting need ``create`` on ``modelversions`` in the namespace, reading needs ``get``.
Writing a run's archive (PUT/POST under ``runs/{run}/``) is for that run's node Pods only:
the caller must be the ServiceAccount of TrainingRun ``{run}`` (``spec.serviceAccountName``,
else ``default``). Tokens are never logged; the Authorizer's answers are cached, bounded.

Every path variable of every route is checked in one place (:func:`checked_variables`,
against :data:`VARIABLES`) before a handler runs, and every path the service opens is
resolved and must stay under ``<root>/<namespace>/`` (``Store.inside``): encoded ``..``,
absolute paths, NUL bytes, overlong names and symbolic links planted in the volume all end
in 400 or 404. Uploads and source snapshots have size limits (:class:`Limits`, 413 beyond).
Tested in ``tests/unit/registry/`` and ``tests/integration/test_registry_service.py``.

:func:`serve` speaks HTTPS with :class:`TLSFiles` (``--tls-cert``/``--tls-key``; a renewed
certificate is loaded within a minute), else plain HTTP with a warning; tested in
``tests/unit/registry/test_tls_and_tokens.py`` and ``tests/integration/test_registry_tls.py``.

    PUT  /v1/namespaces/{ns}/runs/{run}/{outputs|logs}/{path}    upload a file
         ?commit=later: 202 with the sha256 the service computed and an upload id;
    POST /v1/namespaces/{ns}/runs/{run}/{outputs|logs}/{path}?upload=ID  with the
         client's X-Content-SHA256: renames it into place (a one-pass client)
    GET  /v1/namespaces/{ns}/runs/{run}/{outputs|logs}/{path}    download (Range)
    GET  /v1/namespaces/{ns}/runs/{run}                          its files
    POST /v1/namespaces/{ns}/models/{model}/versions             promote {"run", "path"}
    GET  /v1/namespaces/{ns}/models                              models and versions
    GET  /v1/namespaces/{ns}/models/{model}/versions/{v}         manifest
    GET  /v1/namespaces/{ns}/models/{model}/versions/{v}/files/{path}   download (Range)
    GET  /metrics                                                Prometheus (bytes in/out)
    PUT  /v1/namespaces/{ns}/snapshots/{sha256}                 a source snapshot
    GET  /v1/namespaces/{ns}/snapshots/{sha256}                 (HEAD: is it there?)
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import ssl
import tempfile
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from aiohttp import web

from torchyard import metrics
from torchyard.registry.store import (
    MAX_SNAPSHOT_BYTES,
    MAX_UPLOAD_BYTES,
    TMP_PREFIX,
    OutsideNamespace,
    Store,
    Version,
    check_metadata,
    human_size,
)

CHUNK = 4 << 20
TOKEN_HEADER = "X-Torchyard-Token"
MAX_CACHED = 4096  # answers each cache of CachingAuthorizer holds at most
# A TrainingRun deleted and created again under its name may change uid and ServiceAccount:
# its identity is cached briefly, and "no such run" not at all.
RUN_TTL = 5.0
MAX_JSON_BODY = 1 << 20  # a promotion's JSON body
logger = logging.getLogger("torchyard.registry")

# -- the path variables of the routes, all checked by checked_variables ------------------

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
MAX_PATH = 1024  # characters of a file path
MAX_SEGMENT = 255  # bytes of one of its names (what a filesystem takes)


def path_problem(value: str) -> str | None:
    """Why ``value`` is not a file path inside a folder (None when it is): it must be
    relative, with no empty, ``.`` or ``..`` names, no backslash, NUL or control
    character, no name of the registry's own temporaries, and not too long."""
    if not value:
        return "it is empty"
    if len(value) > MAX_PATH:
        return f"it is longer than {MAX_PATH} characters"
    if value.startswith("/"):
        return "it is absolute: give a path relative to the folder"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "it is not UTF-8"
    if any(c == "\\" or ord(c) < 32 or ord(c) == 127 for c in value):
        return "it holds a backslash, a NUL or another control character"
    for name in value.split("/"):
        if name in ("", ".", ".."):
            return "it has an empty, '.' or '..' name"
        if len(name.encode()) > MAX_SEGMENT:
            return f"one of its names is longer than {MAX_SEGMENT} bytes"
        if name.startswith(TMP_PREFIX):
            return f"names starting with {TMP_PREFIX} are the registry's own"
    return None


def _pattern(regex: str | re.Pattern[str], rule: str) -> Callable[[str], str | None]:
    compiled = re.compile(regex)
    return lambda value: None if compiled.fullmatch(value) else rule


_LABEL_RULE = "a DNS-1123 label: at most 63 of a-z, 0-9 and '-', starting and ending alphanumeric"
# Route variable -> (what it is, why a value is refused or None). create_app refuses a
# route with a variable missing here.
VARIABLES: dict[str, tuple[str, Callable[[str], str | None]]] = {
    "ns": ("namespace", _pattern(DNS_LABEL, _LABEL_RULE)),
    "run": ("run", _pattern(DNS_LABEL, _LABEL_RULE)),
    "model": ("model", _pattern(DNS_LABEL, _LABEL_RULE)),
    "v": ("version", _pattern(r"[1-9][0-9]{0,8}", "a version is a number: 1, 2, 3 ...")),
    "kind": ("kind", _pattern(r"outputs|logs", "outputs or logs")),
    "sha": ("sha256", _pattern(r"[0-9a-f]{64}", "64 lowercase hexadecimal digits")),
    "path": ("file path", path_problem),
}


def _shown(value: str) -> str:
    return repr(value if len(value) <= 80 else value[:80] + "...")


@web.middleware
async def checked_variables(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """400 for a route variable outside its rule, before any handler reads it. aiohttp
    matches the encoded path and then decodes it (``..%2F`` becomes ``../``), so this
    looks at what the handlers would get."""
    for key, value in request.match_info.items():
        what, problem = VARIABLES[key]
        why = problem(value)
        if why:
            raise web.HTTPBadRequest(text=f"bad {what} {_shown(value)}: {why}")
    return await handler(request)


@dataclass(frozen=True)
class Limits:
    """The largest bodies the service takes (``torchyard registry serve
    --max-upload-bytes/--max-snapshot-bytes``, Helm ``registry.maxUploadBytes`` and
    ``registry.maxSnapshotBytes``); larger ones get 413 and leave nothing behind."""

    upload_bytes: int = MAX_UPLOAD_BYTES
    snapshot_bytes: int = MAX_SNAPSHOT_BYTES


def _too_large(what: str, limit: int, flag: str, helm: str) -> web.HTTPRequestEntityTooLarge:
    return web.HTTPRequestEntityTooLarge(
        limit,
        text=f"{what} is larger than the registry's limit of {human_size(limit)} "
        f"({limit} bytes): raise it with `torchyard registry serve {flag}` "
        f"(Helm value {helm})",
    )


@dataclass(frozen=True)
class RunIdentity:
    """A TrainingRun as the registry sees it: its uid, and the ServiceAccount its node
    Pods run as (``spec.serviceAccountName``, else ``default``)."""

    uid: str
    service_account: str


class Authorizer(Protocol):
    """Who is this token, and may they do this in that namespace?"""

    def user(self, token: str) -> dict[str, Any] | None: ...

    def allowed(self, user: dict[str, Any], verb: str, namespace: str) -> bool: ...

    def training_run(self, namespace: str, name: str) -> RunIdentity | None:
        """TrainingRun ``name`` in ``namespace``, or None when there is none."""
        ...


K = TypeVar("K")
V = TypeVar("V")


@dataclass
class ExpiringCache(Generic[K, V]):
    """At most ``size`` answers, each for ``ttl`` seconds. Every entry lives as long, so
    the oldest entry is also the first to expire: a put drops expired entries and then
    the oldest ones until the cache fits. Safe to use from several threads."""

    ttl: float
    size: int = MAX_CACHED
    _items: OrderedDict[K, tuple[float, V]] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, key: K) -> tuple[V] | None:
        """``(answer,)`` while it is fresh (the answer may be None), else None."""
        with self._lock:
            hit = self._items.get(key)
            if hit is None or hit[0] <= time.monotonic():
                return None
            return (hit[1],)

    def put(self, key: K, value: V) -> None:
        with self._lock:
            now = time.monotonic()
            self._items.pop(key, None)
            self._items[key] = (now + self.ttl, value)
            while self._items and (
                len(self._items) > self.size or next(iter(self._items.values()))[0] <= now
            ):
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


@dataclass
class CachingAuthorizer:
    """Caches answers for ``ttl`` seconds (keyed by the token's hash, never the token),
    TrainingRuns for at most :data:`RUN_TTL`; at most ``size`` answers of each kind."""

    inner: Authorizer
    ttl: float = 30.0
    size: int = MAX_CACHED
    _users: ExpiringCache[str, dict[str, Any] | None] = field(init=False)
    _decisions: ExpiringCache[tuple[str, str, str], bool] = field(init=False)
    _runs: ExpiringCache[tuple[str, str], RunIdentity] = field(init=False)

    def __post_init__(self) -> None:
        self._users = ExpiringCache(self.ttl, self.size)
        self._decisions = ExpiringCache(self.ttl, self.size)
        self._runs = ExpiringCache(min(self.ttl, RUN_TTL), self.size)

    def user(self, token: str) -> dict[str, Any] | None:
        key = hashlib.sha256(token.encode()).hexdigest()
        hit = self._users.get(key)
        if hit is not None:
            return hit[0]
        user = self.inner.user(token)
        self._users.put(key, user)
        return user

    def allowed(self, user: dict[str, Any], verb: str, namespace: str) -> bool:
        key = (str(user.get("uid") or user.get("username")), verb, namespace)
        hit = self._decisions.get(key)
        if hit is not None:
            return hit[0]
        answer = self.inner.allowed(user, verb, namespace)
        self._decisions.put(key, answer)
        return answer

    def training_run(self, namespace: str, name: str) -> RunIdentity | None:
        hit = self._runs.get((namespace, name))
        if hit is not None:
            return hit[0]
        found = self.inner.training_run(namespace, name)
        if found is not None:
            self._runs.put((namespace, name), found)
        return found


def _token(request: web.Request) -> str:
    """``Authorization: Bearer``, or ``X-Torchyard-Token`` when the request came through
    the apiserver's service proxy (which authenticates the caller itself and drops
    ``Authorization`` before forwarding)."""
    header = request.headers.get("Authorization", "")
    if header.startswith("Bearer "):
        return header[7:].strip()
    return request.headers.get(TOKEN_HEADER, "").strip()


def create_app(
    store: Store, authorizer: Authorizer, limits: Limits | None = None
) -> web.Application:
    """The service's routes over ``store``; every caller is asked of ``authorizer``."""
    auth = authorizer
    limits = limits or Limits()

    # A new exception per request: an aiohttp HTTPException is the response it sends.
    def upload_too_large() -> web.HTTPException:
        return _too_large(
            "the file", limits.upload_bytes, "--max-upload-bytes", "registry.maxUploadBytes"
        )

    def snapshot_too_large() -> web.HTTPException:
        return _too_large(
            "the source snapshot",
            limits.snapshot_bytes,
            "--max-snapshot-bytes",
            "registry.maxSnapshotBytes",
        )

    async def authorize(request: web.Request, verb: str) -> tuple[str, dict[str, Any]]:
        token = _token(request)
        if not token:
            raise web.HTTPUnauthorized(
                text="a Kubernetes bearer token is required", headers={"WWW-Authenticate": "Bearer"}
            )
        loop = asyncio.get_running_loop()
        user = await loop.run_in_executor(None, auth.user, token)
        if user is None:
            raise web.HTTPUnauthorized(
                text="the token is not valid for the registry",
                headers={"WWW-Authenticate": "Bearer"},
            )
        ns = request.match_info["ns"]  # checked by checked_variables
        if not await loop.run_in_executor(None, auth.allowed, user, verb, ns):
            raise web.HTTPForbidden(
                text=f"{user.get('username')} may not {verb} modelversions in {ns}"
            )
        return ns, user

    async def check(request: web.Request, verb: str) -> str:
        return (await authorize(request, verb))[0]

    async def check_archive_writer(request: web.Request) -> str:
        """Writing run ``{run}``'s archive: ``create`` on modelversions, and the caller is
        the ServiceAccount that run's node Pods run as, no other identity."""
        ns, user = await authorize(request, "create")
        run = request.match_info["run"]
        loop = asyncio.get_running_loop()
        found = await loop.run_in_executor(None, auth.training_run, ns, run)
        if found is None:
            raise web.HTTPNotFound(
                text=f"there is no TrainingRun {run} in {ns}: a run's archive is written by "
                "its node Pods while the TrainingRun exists"
            )
        expected = f"system:serviceaccount:{ns}:{found.service_account}"
        if user.get("username") != expected:
            raise web.HTTPForbidden(
                text=f"{user.get('username')} may not write the archive of TrainingRun "
                f"{ns}/{run}: only its node Pods may, as ServiceAccount "
                f"{found.service_account} (the run's spec.serviceAccountName)"
            )
        return ns

    def inside(ns: str, path: Path) -> Path:
        try:
            return store.inside(ns, path)
        except OutsideNamespace:
            raise web.HTTPBadRequest(
                text=f"the path leads out of namespace {ns} in the registry (through '..' or "
                "a symbolic link): refused"
            ) from None

    def run_file(request: web.Request) -> tuple[str, Path]:
        """(namespace, the file) of a ``runs/{run}/{kind}/{path}`` route."""
        info = request.match_info
        ns = info["ns"]
        return ns, inside(ns, store.run_dir(ns, info["run"]) / info["kind"] / info["path"])

    def too_large_up_front(
        request: web.Request, limit: int, error: Callable[[], web.HTTPException]
    ) -> None:
        if request.content_length is not None and request.content_length > limit:
            raise error()

    # Uploads written and fsynced but not yet renamed into place: id -> (tmp, target,
    # sha256, size, deadline). A client that streams without knowing the digest up front
    # (``?commit=later``) confirms it in a second request; nothing is visible before.
    pending: dict[str, tuple[Path, Path, str, int, float]] = {}

    def expire_pending() -> None:
        now = time.monotonic()
        for key, (tmp, *_rest, deadline) in list(pending.items()):
            if deadline < now:
                pending.pop(key, None)
                tmp.unlink(missing_ok=True)

    async def upload(request: web.Request) -> web.StreamResponse:
        await check_archive_writer(request)
        too_large_up_front(request, limits.upload_bytes, upload_too_large)
        _, target = run_file(request)
        if target.is_dir():
            raise web.HTTPConflict(text=f"{request.match_info['path']} is a folder in the archive")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise web.HTTPConflict(
                text=f"a folder of {request.match_info['path']} is a file in the archive"
            ) from None
        upload_id = uuid.uuid4().hex
        tmp = target.parent / f"{TMP_PREFIX}upload-{upload_id}"
        later = request.query.get("commit") == "later"
        keep = False  # a ?commit=later upload waits, out of sight, for its commit
        try:
            size, got = await _receive(request, tmp, limits.upload_bytes, upload_too_large)
            expected = request.headers.get("X-Content-SHA256")
            if expected and expected != got:
                raise web.HTTPBadRequest(text=f"sha256 mismatch: got {got}")
            answer = {"path": request.match_info["path"], "size": size, "sha256": got}
            if later:
                expire_pending()
                pending[upload_id] = (tmp, target, got, size, time.monotonic() + 3600)
                keep = True
                return web.json_response({**answer, "upload": upload_id}, status=202)
            os.replace(tmp, target)
        finally:
            if not keep:
                tmp.unlink(missing_ok=True)
        return web.json_response(answer, status=201)

    async def commit(request: web.Request) -> web.StreamResponse:
        """POST ...?upload=ID with the client's X-Content-SHA256: rename into place."""
        await check_archive_writer(request)
        _, target = run_file(request)
        entry = pending.get(request.query.get("upload", ""))
        if entry is None or entry[1] != target:
            raise web.HTTPNotFound(
                text="no such pending upload (expired or restarted): upload again"
            )
        tmp, _, got, size, _ = pending.pop(request.query["upload"])
        if request.headers.get("X-Content-SHA256") != got:
            tmp.unlink(missing_ok=True)
            raise web.HTTPBadRequest(text=f"sha256 mismatch: the service got {got}")
        os.replace(tmp, target)
        return web.json_response(
            {"path": request.match_info["path"], "size": size, "sha256": got}, status=201
        )

    async def put_snapshot(request: web.Request) -> web.StreamResponse:
        """A source snapshot, stored under its sha256 (which the body must match)."""
        ns = await check(request, "create")
        sha = request.match_info["sha"]
        target = inside(ns, store.snapshot_path(ns, sha))
        if target.is_file():
            return web.json_response({"sha256": sha, "size": target.stat().st_size}, status=200)
        too_large_up_front(request, limits.snapshot_bytes, snapshot_too_large)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f"{TMP_PREFIX}upload-{uuid.uuid4().hex}"
        try:
            size, got = await _receive(request, tmp, limits.snapshot_bytes, snapshot_too_large)
            if got != sha:
                raise web.HTTPBadRequest(text=f"sha256 mismatch: the body's is {got}")
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return web.json_response({"sha256": sha, "size": size}, status=201)

    async def get_snapshot(request: web.Request) -> web.StreamResponse:
        ns = await check(request, "get")
        return _file(inside(ns, store.snapshot_path(ns, request.match_info["sha"])))

    async def list_run(request: web.Request) -> web.StreamResponse:
        ns = await check(request, "get")
        base = inside(ns, store.run_dir(ns, request.match_info["run"]))
        if not base.is_dir():
            raise web.HTTPNotFound(text="no such run in the registry")
        files = sorted(
            p.relative_to(base).as_posix()
            for p in base.rglob("*")
            if p.is_file() and not p.is_symlink() and not p.name.startswith(TMP_PREFIX)
        )
        return web.json_response({"files": files})

    async def download_run(request: web.Request) -> web.StreamResponse:
        await check(request, "get")
        return _file(run_file(request)[1])

    # Promotions of one model wait here, not in the executor's threads, for the store's
    # lock (under which "did this run already publish?" and the publish happen together).
    promoting: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = (
        weakref.WeakValueDictionary()
    )

    async def promote_body(request: web.Request, ns: str) -> tuple[str, str, dict[str, Any]]:
        """(run, path, metadata) of a promotion, checked; 400 says what is wrong."""
        usage = '{"run": NAME, "path": "outputs", "metadata": {...}}'
        try:
            body = await request.json()
        except web.HTTPRequestEntityTooLarge:
            raise web.HTTPRequestEntityTooLarge(
                MAX_JSON_BODY, text=f"a promotion's body is at most {MAX_JSON_BODY} bytes"
            ) from None
        except ValueError:
            raise web.HTTPBadRequest(text=f"the body must be JSON {usage}") from None
        if not isinstance(body, dict) or not isinstance(body.get("run"), str):
            raise web.HTTPBadRequest(text=f"the body must be JSON {usage}")
        run, path, metadata = body["run"], body.get("path") or "outputs", body.get("metadata")
        for what, value, problem in (
            ("run", run, VARIABLES["run"][1]),
            ("path", path, path_problem),
        ):
            why = problem(value) if isinstance(value, str) else "it is not a string"
            if why:
                raise web.HTTPBadRequest(text=f"bad {what} {_shown(str(value))}: {why}")
        if not isinstance(metadata, dict | None):
            raise web.HTTPBadRequest(text="metadata must be a JSON object")
        metadata = metadata or {}
        try:
            check_metadata(metadata)
        except ValueError as err:
            raise web.HTTPBadRequest(text=f"{err}; remove it from the promotion") from None
        made_by = metadata.get("run") or {}
        for key, want in (("name", run), ("namespace", ns)):
            if made_by.get(key, want) != want:
                raise web.HTTPBadRequest(
                    text=f"metadata run.{key} {made_by[key]!r} is not {want!r}, the run promoted"
                )
        return run, path, metadata

    async def promote(request: web.Request) -> web.StreamResponse:
        ns = await check(request, "create")
        model = request.match_info["model"]
        run, path, metadata = await promote_body(request, ns)
        loop = asyncio.get_running_loop()
        uid = str((metadata.get("run") or {}).get("uid") or "")
        if uid:  # the same run again returns its version: the uid must be that run's
            found = await loop.run_in_executor(None, auth.training_run, ns, run)
            if found is not None and found.uid != uid:
                raise web.HTTPConflict(
                    text=f"metadata run.uid {uid} is not the uid of TrainingRun {ns}/{run} "
                    f"({found.uid}): promote with the uid of the run that made the archive"
                )
        source = inside(ns, store.run_dir(ns, run) / path)
        if not source.exists():
            raise web.HTTPNotFound(text=f"run {run} has no {path}")
        lock = promoting.setdefault((ns, model), asyncio.Lock())
        async with lock:
            try:
                version, created = await loop.run_in_executor(
                    None,
                    lambda: store.publish_run(
                        ns,
                        model,
                        source,
                        run=run,
                        run_uid=uid,
                        metadata=metadata,
                        within=store.root / ns,
                    ),
                )
            except ValueError as err:  # a link out of the namespace, refused metadata
                raise web.HTTPBadRequest(text=str(err)) from None
        return web.json_response(version.manifest, status=201 if created else 200)

    async def models(request: web.Request) -> web.StreamResponse:
        ns = await check(request, "get")
        root = store.root / ns / "models"
        found = {}
        if root.is_dir() and not root.is_symlink():
            for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()):
                found[folder.name] = store.versions(ns, folder.name)
        return web.json_response({"models": found})

    async def version_of(request: web.Request) -> tuple[str, Version]:
        ns = await check(request, "get")
        model, number = request.match_info["model"], int(request.match_info["v"])
        inside(ns, store.model_dir(ns, model) / str(number))
        try:
            return ns, store.get(ns, model, number)
        except (KeyError, OSError, ValueError):
            raise web.HTTPNotFound(text="no such model version") from None

    async def manifest(request: web.Request) -> web.StreamResponse:
        return web.json_response((await version_of(request))[1].manifest)

    async def download_model(request: web.Request) -> web.StreamResponse:
        ns, version = await version_of(request)
        return _file(inside(ns, version.path / request.match_info["path"]))

    async def healthz(request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    app = web.Application(client_max_size=MAX_JSON_BODY, middlewares=[checked_variables])
    prefix = "/v1/namespaces/{ns}"
    runs = prefix + "/runs/{run}/{kind:outputs|logs}/{path:.+}"
    app.router.add_get(prefix + "/runs/{run}", list_run)
    app.router.add_put(runs, upload)
    app.router.add_post(runs, commit)
    app.router.add_get(runs, download_run)
    app.router.add_post(prefix + "/models/{model}/versions", promote)
    app.router.add_get(prefix + "/models", models)
    app.router.add_get(prefix + "/models/{model}/versions/{v}", manifest)
    app.router.add_get(prefix + "/models/{model}/versions/{v}/files/{path:.+}", download_model)
    snapshots = prefix + "/snapshots/{sha:[a-f0-9]{64}}"
    app.router.add_put(snapshots, put_snapshot)
    app.router.add_get(snapshots, get_snapshot)  # also answers HEAD
    app.router.add_get("/healthz", healthz)
    _add_metrics(app)
    unchecked = {
        name
        for resource in app.router.resources()
        for name in re.findall(r"\{(\w+)", resource.canonical)
    } - VARIABLES.keys()
    if unchecked:  # a new route must say what its variables may hold
        raise RuntimeError(f"route variables without a rule in VARIABLES: {sorted(unchecked)}")
    return app


def _add_metrics(app: web.Application) -> None:
    """``GET /metrics`` (Prometheus, no token: counters only) with the bytes of files the
    service received (uploads of run files and snapshots) and sent (downloads)."""
    registry = metrics.Registry()
    received = registry.counter(
        "torchyard_registry_received_bytes_total",
        "Bytes of files uploaded (run outputs and logs, source snapshots).",
    )
    sent = registry.counter(
        "torchyard_registry_sent_bytes_total",
        "Bytes of files downloaded (run files, model files, source snapshots).",
    )

    @web.middleware
    async def count_received(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            response: web.StreamResponse = await handler(request)
            return response
        finally:
            if request.method == "PUT":
                received.inc(request.content.total_bytes)

    async def count_sent(request: web.Request, response: web.StreamResponse) -> None:
        if isinstance(response, web.FileResponse) and request.method != "HEAD":
            sent.inc(response.content_length or 0)

    async def scrape(request: web.Request) -> web.StreamResponse:
        return web.Response(
            body=registry.render().encode(), headers={"Content-Type": metrics.CONTENT_TYPE}
        )

    app.middlewares.append(count_received)
    app.on_response_prepare.append(count_sent)
    app.router.add_get("/metrics", scrape)


async def _receive(
    request: web.Request, tmp: Path, limit: int, too_large: Callable[[], web.HTTPException]
) -> tuple[int, str]:
    """Stream the request body into ``tmp`` (new), hashing it; fsynced. (size, sha256)
    ``too_large`` is raised as soon as more than ``limit`` bytes came (a chunked body has
    no Content-Length to check up front); the caller removes ``tmp``."""
    digest = hashlib.sha256()
    size = 0
    loop = asyncio.get_running_loop()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    pending_io: asyncio.Future[None] | None = None
    try:

        def consume(chunks: list[bytes]) -> None:
            for chunk in chunks:  # both release the GIL: overlap the next reads
                os.write(fd, chunk)
                digest.update(chunk)

        batch: list[bytes] = []
        batched = 0
        async for chunk in request.content.iter_any():
            size += len(chunk)
            if size > limit:
                raise too_large()
            batch.append(chunk)
            batched += len(chunk)
            if batched >= CHUNK:
                if pending_io is not None:
                    await pending_io
                pending_io = loop.run_in_executor(None, consume, batch)
                batch, batched = [], 0
        if pending_io is not None:
            await pending_io
        consume(batch)
        await loop.run_in_executor(None, os.fsync, fd)
    finally:
        if pending_io is not None and not pending_io.done():
            await asyncio.wait([pending_io])  # never close fd under a write in flight
        os.close(fd)
    return size, digest.hexdigest()


def _file(path: Path) -> web.StreamResponse:
    if not path.is_file():
        raise web.HTTPNotFound(text="no such file")
    # FileResponse streams in chunks and answers Range requests (206) by itself.
    return web.FileResponse(path, chunk_size=CHUNK)


class TLSFiles:
    """The service's certificate and key (``--tls-cert``/``--tls-key``), loaded into one
    server :class:`ssl.SSLContext` and loaded again when the files change: cert-manager
    renews the Secret and the kubelet swaps the mounted files; new connections get the
    new certificate, open ones keep theirs."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert, self.key = cert, key
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._loaded: tuple[bytes, bytes] = (b"", b"")
        self.refresh()

    def _contents(self) -> tuple[bytes, bytes]:
        try:
            return self.cert.read_bytes(), self.key.read_bytes()
        except OSError as err:
            raise ValueError(f"cannot read the TLS certificate or key: {err}") from None

    def refresh(self) -> bool:
        """Load the files when they differ from what is loaded; True when it did. A pair
        that does not load (half-written by a renewal) raises and leaves the loaded one."""
        contents = self._contents()
        if contents == self._loaded:
            return False
        # One snapshot of both files, checked in a scratch context first: a failed load
        # would leave the live context with a certificate and a key that do not match.
        with tempfile.TemporaryDirectory(prefix="torchyard-tls-") as scratch:
            cert, key = Path(scratch, "tls.crt"), Path(scratch, "tls.key")
            cert.write_bytes(contents[0])
            key.write_bytes(contents[1])
            try:
                ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
            except ssl.SSLError as err:
                raise ValueError(
                    f"{self.cert} and {self.key} are not a PEM certificate and its private "
                    f"key: {err.reason or err}"
                ) from None
            self.context.load_cert_chain(cert, key)
        self._loaded = contents
        return True


async def _watch(tls: TLSFiles, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            if tls.refresh():
                logger.info("loaded the renewed TLS certificate %s", tls.cert)
        except ValueError as err:  # half-written by a renewal: the old one stays
            logger.warning("keeping the current TLS certificate: %s", err)


def serve(
    root: Path,
    authorizer: Authorizer,
    host: str = "0.0.0.0",
    port: int = 8080,
    tls: TLSFiles | None = None,
    reload_seconds: float = 60.0,
    limits: Limits | None = None,
) -> None:
    """Run the service until interrupted (``torchyard registry serve``): over HTTPS with
    ``tls`` (reloading renewed files every ``reload_seconds``), else plain HTTP with a
    warning, since bearer tokens and model files would cross the network in the clear."""
    store = Store(root)
    store.remove_all_temporaries()  # the service owns the volume: nothing else writes there
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # no headers in logs
    app = create_app(store, CachingAuthorizer(authorizer), limits)
    if tls is None:
        logger.warning(
            "serving plain HTTP: bearer tokens and model files cross the network unencrypted; "
            "pass --tls-cert and --tls-key (the Helm chart does, registry.tls.enabled)"
        )
    else:

        async def watch_certificate(app: web.Application) -> AsyncIterator[None]:
            task = asyncio.create_task(_watch(tls, reload_seconds))
            yield
            task.cancel()

        app.cleanup_ctx.append(watch_certificate)
    web.run_app(
        app,
        host=host,
        port=port,
        ssl_context=tls.context if tls else None,
        print=lambda text: logger.info("%s", text),
        access_log=None,
    )
