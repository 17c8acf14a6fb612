"""The registry service's routes for run archives and source snapshots.

A run's node Pods upload ``runs/{run}/{outputs|logs}/{path}`` (PUT; only as that run's
ServiceAccount, ``Access.archive_writer``); each file is written to a temporary file
while its sha256 is computed, checked against ``X-Content-SHA256`` when given, fsynced
and renamed into place, so a killed service never leaves a partial file visible. A client
that streams without knowing the digest up front (the launcher: one pass over the file)
sends ``?commit=later``, gets 202 with the service's sha256 and an upload id, and POSTs
its own digest with ``?upload=ID`` to rename the file into place; nothing is visible
before, and an uncommitted upload is removed after an hour. Readers list a run's files
with their sizes and download them (Range). Source snapshots (``snapshots/{sha}``) are
stored under their sha256, which the body must match.

:class:`Archives` holds the handlers; ``registry.service.create_app`` routes to them.
Tested in ``tests/unit/registry/test_service.py`` and
``tests/integration/test_registry_service.py``, ``test_archiving.py``.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from aiohttp import web

from torchyard.registry import bodies
from torchyard.registry.access import Access
from torchyard.registry.bodies import Limits
from torchyard.registry.store import TMP_PREFIX

PENDING_SECONDS = 3600.0  # how long an upload waits for its ``?upload=ID`` commit


class Archives:
    """Handlers of ``runs/{run}/...`` and ``snapshots/{sha}``."""

    def __init__(self, access: Access, limits: Limits) -> None:
        self.access = access
        self.store = access.store
        self.limits = limits
        # Uploads written and fsynced but not yet renamed into place: id -> (tmp, target,
        # sha256, size, deadline).
        self.pending: dict[str, tuple[Path, Path, str, int, float]] = {}

    def _expire_pending(self) -> None:
        now = time.monotonic()
        for key, (tmp, *_rest, deadline) in list(self.pending.items()):
            if deadline < now:
                self.pending.pop(key, None)
                tmp.unlink(missing_ok=True)

    async def upload(self, request: web.Request) -> web.StreamResponse:
        """PUT a run file (``?commit=later``: 202, renamed into place by :meth:`commit`)."""
        await self.access.archive_writer(request)
        too_large = self.limits.upload_too_large
        bodies.too_large_up_front(request, self.limits.upload_bytes, too_large)
        target = self.access.run_file(request)
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
            size, got = await bodies.receive(request, tmp, self.limits.upload_bytes, too_large)
            # (headers' names have no case: mutants that change the name's case survive)
            expected = request.headers.get("X-Content-SHA256")
            if expected and expected != got:
                raise web.HTTPBadRequest(text=f"sha256 mismatch: got {got}")
            answer = {"path": request.match_info["path"], "size": size, "sha256": got}
            if later:
                self._expire_pending()
                deadline = time.monotonic() + PENDING_SECONDS
                self.pending[upload_id] = (tmp, target, got, size, deadline)
                keep = True
                return web.json_response({**answer, "upload": upload_id}, status=202)
            os.replace(tmp, target)
        finally:
            if not keep:
                tmp.unlink(missing_ok=True)
        return web.json_response(answer, status=201)

    async def commit(self, request: web.Request) -> web.StreamResponse:
        """POST ...?upload=ID with the client's X-Content-SHA256: rename into place."""
        await self.access.archive_writer(request)
        target = self.access.run_file(request)
        entry = self.pending.get(request.query.get("upload", ""))
        if entry is None or entry[1] != target:
            raise web.HTTPNotFound(
                text="no such pending upload (expired or restarted): upload again"
            )
        tmp, _, got, size, _ = self.pending.pop(request.query["upload"])
        # (headers' names have no case: mutants that change the name's case survive)
        if request.headers.get("X-Content-SHA256") != got:
            tmp.unlink(missing_ok=True)
            raise web.HTTPBadRequest(text=f"sha256 mismatch: the service got {got}")
        os.replace(tmp, target)
        return web.json_response(
            {"path": request.match_info["path"], "size": size, "sha256": got}, status=201
        )

    async def list_run(self, request: web.Request) -> web.StreamResponse:
        """GET ``runs/{run}[?uid=]``: the paths of its files (``files``), each with its size
        in bytes (``entries``: ``{"path", "size"}``), and the uid of the run they are of
        (``owner``; '' when none is recorded)."""
        ns = await self.access.namespace(request, "get")
        folder, owner = self.access.archive_folder(request)
        base = self.access.inside(ns, folder)
        if not base.is_dir():
            raise web.HTTPNotFound(text="no such run in the registry")
        found = sorted(
            (p.relative_to(base).as_posix(), p)
            for p in base.rglob("*")
            if p.is_file() and not p.is_symlink() and not p.name.startswith(TMP_PREFIX)
        )
        entries = [{"path": rel, "size": p.stat().st_size} for rel, p in found]
        files = [rel for rel, _ in found]
        return web.json_response({"files": files, "entries": entries, "owner": owner})

    async def download(self, request: web.Request) -> web.StreamResponse:
        """GET a run file (Range; ``?uid=``: of that run's archive)."""
        await self.access.namespace(request, "get")
        return bodies.file_response(self.access.archived_file(request))

    async def put_snapshot(self, request: web.Request) -> web.StreamResponse:
        """A source snapshot, stored under its sha256 (which the body must match)."""
        ns = await self.access.namespace(request, "create")
        sha = request.match_info["sha"]
        target = self.access.inside(ns, self.store.snapshot_path(ns, sha))
        if target.is_file():  # (200 is also the default status: that mutant survives)
            return web.json_response({"sha256": sha, "size": target.stat().st_size}, status=200)
        limit, too_large = self.limits.snapshot_bytes, self.limits.snapshot_too_large
        bodies.too_large_up_front(request, limit, too_large)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f"{TMP_PREFIX}upload-{uuid.uuid4().hex}"
        try:
            size, got = await bodies.receive(request, tmp, limit, too_large)
            if got != sha:
                raise web.HTTPBadRequest(text=f"sha256 mismatch: the body's is {got}")
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return web.json_response({"sha256": sha, "size": size}, status=201)

    async def get_snapshot(self, request: web.Request) -> web.StreamResponse:
        """GET (or HEAD) a source snapshot."""
        ns = await self.access.namespace(request, "get")
        path = self.store.snapshot_path(ns, request.match_info["sha"])
        return bodies.file_response(self.access.inside(ns, path))
