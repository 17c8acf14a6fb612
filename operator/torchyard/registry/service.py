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
Tokens are never logged.

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
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from torchyard import metrics
from torchyard.registry.store import TMP_PREFIX, Store, Version

CHUNK = 4 << 20
TOKEN_HEADER = "X-Torchyard-Token"
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
logger = logging.getLogger("torchyard.registry")


class Authorizer(Protocol):
    """Who is this token, and may they do this in that namespace?"""

    def user(self, token: str) -> dict[str, Any] | None: ...

    def allowed(self, user: dict[str, Any], verb: str, namespace: str) -> bool: ...


@dataclass
class CachingAuthorizer:
    """Caches answers for ``ttl`` seconds (keyed by the token's hash, never the token)."""

    inner: Authorizer
    ttl: float = 30.0
    _users: dict[str, tuple[float, dict[str, Any] | None]] = field(default_factory=dict)
    _decisions: dict[tuple[str, str, str], tuple[float, bool]] = field(default_factory=dict)

    def user(self, token: str) -> dict[str, Any] | None:
        key = hashlib.sha256(token.encode()).hexdigest()
        hit = self._users.get(key)
        if hit and hit[0] > time.monotonic():
            return hit[1]
        user = self.inner.user(token)
        self._users[key] = (time.monotonic() + self.ttl, user)
        return user

    def allowed(self, user: dict[str, Any], verb: str, namespace: str) -> bool:
        key = (str(user.get("uid") or user.get("username")), verb, namespace)
        hit = self._decisions.get(key)
        if hit and hit[0] > time.monotonic():
            return hit[1]
        answer = self.inner.allowed(user, verb, namespace)
        self._decisions[key] = (time.monotonic() + self.ttl, answer)
        return answer


def _safe_path(base: Path, relative: str) -> Path:
    """``base/relative``, refusing anything that would leave ``base``."""
    target = (base / relative).resolve()
    if not relative or relative.startswith("/") or base.resolve() not in target.parents:
        raise web.HTTPBadRequest(text=f"bad path {relative!r}")
    return target


def _name(value: str, what: str) -> str:
    if not NAME.match(value) or len(value) > 63:
        raise web.HTTPBadRequest(text=f"bad {what} {value!r}")
    return value


def _token(request: web.Request) -> str:
    """``Authorization: Bearer``, or ``X-Torchyard-Token`` when the request came through
    the apiserver's service proxy (which authenticates the caller itself and drops
    ``Authorization`` before forwarding)."""
    header = request.headers.get("Authorization", "")
    if header.startswith("Bearer "):
        return header[7:].strip()
    return request.headers.get(TOKEN_HEADER, "").strip()


def create_app(store: Store, authorizer: Authorizer) -> web.Application:
    auth = authorizer

    async def check(request: web.Request, verb: str) -> str:
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
        ns = _name(request.match_info["ns"], "namespace")
        if not await loop.run_in_executor(None, auth.allowed, user, verb, ns):
            raise web.HTTPForbidden(
                text=f"{user.get('username')} may not {verb} modelversions in {ns}"
            )
        return ns

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
        ns = await check(request, "create")
        run = _name(request.match_info["run"], "run")
        base = store.run_dir(ns, run) / request.match_info["kind"]
        target = _safe_path(base, request.match_info["path"])
        target.parent.mkdir(parents=True, exist_ok=True)
        upload_id = uuid.uuid4().hex
        tmp = target.parent / f"{TMP_PREFIX}upload-{upload_id}"
        later = request.query.get("commit") == "later"
        keep = False  # a ?commit=later upload waits, out of sight, for its commit
        try:
            size, got = await _receive(request, tmp)
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
        ns = await check(request, "create")
        run = _name(request.match_info["run"], "run")
        base = store.run_dir(ns, run) / request.match_info["kind"]
        target = _safe_path(base, request.match_info["path"])
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
        target = store.snapshot_path(ns, sha)
        if target.is_file():
            return web.json_response({"sha256": sha, "size": target.stat().st_size}, status=200)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f"{TMP_PREFIX}upload-{uuid.uuid4().hex}"
        try:
            size, got = await _receive(request, tmp)
            if got != sha:
                raise web.HTTPBadRequest(text=f"sha256 mismatch: the body's is {got}")
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return web.json_response({"sha256": sha, "size": size}, status=201)

    async def get_snapshot(request: web.Request) -> web.StreamResponse:
        ns = await check(request, "get")
        return _file(store.snapshot_path(ns, request.match_info["sha"]))

    async def list_run(request: web.Request) -> web.StreamResponse:
        ns = await check(request, "get")
        base = store.run_dir(ns, _name(request.match_info["run"], "run"))
        if not base.is_dir():
            raise web.HTTPNotFound(text="no such run in the registry")
        files = sorted(
            p.relative_to(base).as_posix()
            for p in base.rglob("*")
            if p.is_file() and not p.name.startswith(TMP_PREFIX)
        )
        return web.json_response({"files": files})

    async def download_run(request: web.Request) -> web.StreamResponse:
        ns = await check(request, "get")
        run = _name(request.match_info["run"], "run")
        base = store.run_dir(ns, run) / request.match_info["kind"]
        return _file(_safe_path(base, request.match_info["path"]))

    async def promote(request: web.Request) -> web.StreamResponse:
        ns = await check(request, "create")
        model = _name(request.match_info["model"], "model")
        try:
            body = await request.json()
            run = _name(str(body["run"]), "run")
        except (ValueError, KeyError, TypeError):
            raise web.HTTPBadRequest(text='body must be JSON {"run": ..., "path": ...}') from None
        source = _safe_path(store.run_dir(ns, run), str(body.get("path") or "outputs"))
        if not source.exists():
            raise web.HTTPNotFound(text=f"run {run} has no {body.get('path', 'outputs')}")
        metadata = dict(body.get("metadata") or {})
        uid = (metadata.get("run") or {}).get("uid")
        if uid:  # promoting the same run again returns the version it already made
            for number in store.versions(ns, model):
                earlier = store.get(ns, model, number).manifest
                if (earlier.get("run") or {}).get("uid") == uid:
                    return web.json_response(earlier, status=200)
        loop = asyncio.get_running_loop()
        version = await loop.run_in_executor(
            None,
            lambda: store.publish(ns, model, source, metadata=metadata),
        )
        return web.json_response(version.manifest, status=201)

    async def models(request: web.Request) -> web.StreamResponse:
        ns = await check(request, "get")
        root = store.root / ns / "models"
        found = {}
        if root.is_dir():
            for folder in sorted(p for p in root.iterdir() if p.is_dir()):
                found[folder.name] = store.versions(ns, folder.name)
        return web.json_response({"models": found})

    async def version_of(request: web.Request) -> Version:
        ns = await check(request, "get")
        try:
            return store.get(ns, request.match_info["model"], int(request.match_info["v"]))
        except (KeyError, ValueError):
            raise web.HTTPNotFound(text="no such model version") from None

    async def manifest(request: web.Request) -> web.StreamResponse:
        return web.json_response((await version_of(request)).manifest)

    async def download_model(request: web.Request) -> web.StreamResponse:
        version = await version_of(request)
        return _file(_safe_path(version.path, request.match_info["path"]))

    async def healthz(request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    app = web.Application(client_max_size=0)
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


async def _receive(request: web.Request, tmp: Path) -> tuple[int, str]:
    """Stream the request body into ``tmp`` (new), hashing it; fsynced. (size, sha256)"""
    digest = hashlib.sha256()
    size = 0
    loop = asyncio.get_running_loop()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:

        def consume(chunks: list[bytes]) -> None:
            for chunk in chunks:  # both release the GIL: overlap the next reads
                os.write(fd, chunk)
                digest.update(chunk)

        pending_io: asyncio.Future[None] | None = None
        batch: list[bytes] = []
        batched = 0
        async for chunk in request.content.iter_any():
            batch.append(chunk)
            batched += len(chunk)
            size += len(chunk)
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
        os.close(fd)
    return size, digest.hexdigest()


def _file(path: Path) -> web.StreamResponse:
    if not path.is_file():
        raise web.HTTPNotFound(text="no such file")
    # FileResponse streams in chunks and answers Range requests (206) by itself.
    return web.FileResponse(path, chunk_size=CHUNK)


def serve(root: Path, authorizer: Authorizer, host: str = "0.0.0.0", port: int = 8080) -> None:
    """Run the service until interrupted (``torchyard registry serve``)."""
    store = Store(root)
    store.remove_all_temporaries()  # the service owns the volume: nothing else writes there
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # no headers in logs
    web.run_app(
        create_app(store, CachingAuthorizer(authorizer)),
        host=host,
        port=port,
        print=lambda text: logger.info("%s", text),
        access_log=None,
    )
