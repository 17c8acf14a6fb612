"""The registry service's routes for models: promote a run's outputs, list, read back.

``POST models/{model}/versions`` with ``{"run", "path", "metadata"}`` publishes the run's
archived ``path`` (``outputs`` by default) as the model's next immutable version
(``Store.publish_run``: atomic rename, sha256 per file); promoting the same run again
answers its existing version (200 instead of 201), and a ``metadata.run.uid`` must be
that TrainingRun's uid (409). Promotions of one model wait for each other on an asyncio
lock, not in the executor's threads. Readers list models and versions, read a version's
manifest and download its files (Range).

:class:`Versions` holds the handlers; ``registry.service.create_app`` routes to them.
Tested in ``tests/unit/registry/test_service.py``, ``test_client.py`` and
``tests/integration/test_registry_service.py``.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from aiohttp import web

from torchyard.registry import bodies
from torchyard.registry.access import Access
from torchyard.registry.store import Version, check_metadata
from torchyard.registry.variables import VARIABLES, path_problem, shown

USAGE = '{"run": NAME, "path": "outputs", "metadata": {...}}'


async def promotion(request: web.Request, ns: str) -> tuple[str, str, dict[str, Any]]:
    """(run, path, metadata) of a promotion's body, checked; 400 says what is wrong."""
    try:
        body = await request.json()
    except web.HTTPRequestEntityTooLarge:
        raise web.HTTPRequestEntityTooLarge(
            bodies.MAX_JSON_BODY, text=f"a promotion's body is at most {bodies.MAX_JSON_BODY} bytes"
        ) from None
    except ValueError:
        raise web.HTTPBadRequest(text=f"the body must be JSON {USAGE}") from None
    if not isinstance(body, dict) or not isinstance(body.get("run"), str):
        raise web.HTTPBadRequest(text=f"the body must be JSON {USAGE}")
    run, path, metadata = body["run"], body.get("path") or "outputs", body.get("metadata")
    for what, value, problem in (
        ("run", run, VARIABLES["run"][1]),
        ("path", path, path_problem),
    ):
        why = problem(value) if isinstance(value, str) else "it is not a string"
        if why:
            raise web.HTTPBadRequest(text=f"bad {what} {shown(str(value))}: {why}")
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


class Versions:
    """Handlers of ``models`` and ``models/{model}/versions/...``."""

    def __init__(self, access: Access) -> None:
        self.access = access
        self.store = access.store
        # Promotions of one model wait here, not in the executor's threads, for the
        # store's lock (under which "did this run already publish?" and the publish
        # happen together).
        self.promoting: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )

    async def promote(self, request: web.Request) -> web.StreamResponse:
        """POST ``models/{model}/versions``: 201 with a new version's manifest, 200 with
        the version this run already made."""
        ns = await self.access.namespace(request, "create")
        model = request.match_info["model"]
        run, path, metadata = await promotion(request, ns)
        uid = str((metadata.get("run") or {}).get("uid") or "")
        if uid:  # the same run again returns its version: the uid must be that run's
            found = await self.access.training_run(ns, run)
            if found is not None and found.uid != uid:
                raise web.HTTPConflict(
                    text=f"metadata run.uid {uid} is not the uid of TrainingRun {ns}/{run} "
                    f"({found.uid}): promote with the uid of the run that made the archive"
                )
        store = self.store
        source = self.access.inside(ns, store.run_dir(ns, run) / path)
        if not source.exists():
            raise web.HTTPNotFound(text=f"run {run} has no {path}")
        lock = self.promoting.setdefault((ns, model), asyncio.Lock())
        loop = asyncio.get_running_loop()
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

    async def models(self, request: web.Request) -> web.StreamResponse:
        """GET ``models``: every model of the namespace with its versions."""
        ns = await self.access.namespace(request, "get")
        root = self.store.root / ns / "models"
        found = {}
        if root.is_dir() and not root.is_symlink():
            for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()):
                found[folder.name] = self.store.versions(ns, folder.name)
        return web.json_response({"models": found})

    async def _version(self, request: web.Request) -> tuple[str, Version]:
        ns = await self.access.namespace(request, "get")
        model, number = request.match_info["model"], int(request.match_info["v"])
        self.access.inside(ns, self.store.model_dir(ns, model) / str(number))
        try:
            return ns, self.store.get(ns, model, number)
        except (KeyError, OSError, ValueError):
            raise web.HTTPNotFound(text="no such model version") from None

    async def manifest(self, request: web.Request) -> web.StreamResponse:
        """GET ``models/{model}/versions/{v}``: its manifest."""
        return web.json_response((await self._version(request))[1].manifest)

    async def download(self, request: web.Request) -> web.StreamResponse:
        """GET ``models/{model}/versions/{v}/files/{path}`` (Range)."""
        ns, version = await self._version(request)
        return bodies.file_response(
            self.access.inside(ns, version.path / request.match_info["path"])
        )
