"""Who is asking the registry service, and what one request may touch.

:class:`Access` reads the caller's Kubernetes bearer token (``Authorization: Bearer``, or
``X-Torchyard-Token`` through the apiserver's service proxy), asks the service's
:class:`~torchyard.registry.auth.Authorizer` who it is (401 without a valid token) and
whether it may ``get`` or ``create`` modelversions (a record's writer: ``runrecords``) in
the route's namespace (403), checks
that the writer of a run's archive is that run's ServiceAccount, and keeps every path the
service opens under ``<root>/<namespace>/`` (``Store.inside``: 400 for ``..`` or a planted
symbolic link). The Authorizer's calls block, so they run in the executor.

Used by the handlers of ``registry.archives`` and ``registry.versions``; tested in
``tests/unit/registry/test_service.py`` and ``tests/integration/test_registry_service.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiohttp import web

from torchyard.registry import run_owner
from torchyard.registry.auth import RESOURCE, Authorizer, RunIdentity
from torchyard.registry.client import TOKEN_HEADER
from torchyard.registry.store import OutsideNamespace, Store


def token(request: web.Request) -> str:
    """``Authorization: Bearer``, or ``X-Torchyard-Token`` when the request came through
    the apiserver's service proxy (which authenticates the caller itself and drops
    ``Authorization`` before forwarding)."""
    # no mutate: headers' names have no case (aiohttp), and a stand-in for a missing
    # header is no "Bearer " either; None instead of "" fails every request without one
    header = request.headers.get("Authorization", "")  # pragma: no mutate
    if header.startswith("Bearer "):
        return header[7:].strip()
    return request.headers.get(TOKEN_HEADER, "").strip()


class Access:
    """The service's store, and the authorizer every caller is asked of."""

    def __init__(self, store: Store, authorizer: Authorizer) -> None:
        self.store = store
        self.authorizer = authorizer

    async def caller(
        self, request: web.Request, verb: str, resource: str = RESOURCE
    ) -> tuple[str, dict[str, Any]]:
        """(namespace, user) of a request that may ``verb`` ``resource`` there."""
        bearer = token(request)
        if not bearer:
            raise web.HTTPUnauthorized(
                text="a Kubernetes bearer token is required", headers={"WWW-Authenticate": "Bearer"}
            )
        loop = asyncio.get_running_loop()
        user = await loop.run_in_executor(None, self.authorizer.user, bearer)
        if user is None:
            raise web.HTTPUnauthorized(
                text="the token is not valid for the registry",
                headers={"WWW-Authenticate": "Bearer"},
            )
        ns = request.match_info["ns"]  # checked by variables.checked_variables
        allowed = self.authorizer.allowed
        if not await loop.run_in_executor(None, allowed, user, verb, ns, resource):
            raise web.HTTPForbidden(
                text=f"{user.get('username')} may not {verb} {resource} in {ns}"
            )
        return ns, user

    async def namespace(self, request: web.Request, verb: str) -> str:
        """The request's namespace, once the caller may ``verb`` modelversions there."""
        return (await self.caller(request, verb))[0]

    async def training_run(self, ns: str, run: str) -> RunIdentity | None:
        """TrainingRun ``ns/run`` as the registry sees it, None when there is none."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.authorizer.training_run, ns, run)

    async def archive_writer(self, request: web.Request) -> str:
        """Writing run ``{run}``'s archive: ``create`` on modelversions, and the caller is
        the ServiceAccount that run's node Pods run as, no other identity. The archive
        becomes this run's (``run_owner.claim``: an earlier run's of the name moves aside)."""
        ns, user = await self.caller(request, "create")
        run = request.match_info["run"]
        found = await self.training_run(ns, run)
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
        if found.uid:
            run_owner.claim(self.store, ns, run, found.uid)
        return ns

    def inside(self, ns: str, path: Path) -> Path:
        """``path`` resolved, when it stays under ``<root>/<ns>/``; 400 otherwise."""
        try:
            return self.store.inside(ns, path)
        except OutsideNamespace:
            raise web.HTTPBadRequest(
                text=f"the path leads out of namespace {ns} in the registry (through '..' or "
                "a symbolic link): refused"
            ) from None

    def run_file(self, request: web.Request) -> Path:
        """The file of a ``runs/{run}/{kind}/{path}`` route (the archive as it is now: the
        one its node Pods write)."""
        info = request.match_info
        ns = info["ns"]
        return self.inside(ns, self.store.run_dir(ns, info["run"]) / info["kind"] / info["path"])

    def archive_folder(self, request: web.Request) -> tuple[Path, str]:
        """The folder of ``runs/{run}`` a reader asks for, with its recorded owner ('' when
        none is recorded): the archive of the run of ``?uid=`` when given
        (``run_owner.archive_of``: moved aside when a later run of the name took the
        name's archive), else the name's archive as it is now. 404 when that uid's archive
        is in neither place; 400 for a ``uid`` that is not one."""
        info = request.match_info
        ns, run = info["ns"], info["run"]
        uid = request.query.get("uid")
        if uid is None:
            return self.store.run_dir(ns, run), run_owner.owner(self.store, ns, run)
        if not run_owner.UID.fullmatch(uid) or uid == "owner":
            raise web.HTTPBadRequest(text=f"not a uid: {uid[:80]!r}")
        folder, owner = run_owner.archive_of(self.store, ns, run, uid)
        if folder is None:
            raise web.HTTPNotFound(
                text=f"the registry holds no archive of run {run} with uid {uid}: it uploaded "
                f"nothing, or it is gone (runs/{run} is the archive of uid {owner})"
            )
        return folder, owner

    def archived_file(self, request: web.Request) -> Path:
        """The file of a ``runs/{run}/{kind}/{path}`` route a reader asks for (``?uid=``:
        :meth:`archive_folder`)."""
        info = request.match_info
        folder, _ = self.archive_folder(request)
        return self.inside(info["ns"], folder / info["kind"] / info["path"])
