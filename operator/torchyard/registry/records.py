"""The registry service's routes for run records (``torchyard.records``).

The operator PUTs a record when a TrainingRun, Sweep or Environment build ends (or is
deleted before it ended); only a caller allowed ``create`` on ``runrecords`` (group
torchyard.dev, a name RBAC grants and no object has: the chart gives it to the operator
alone) in the record's namespace may, and the body must name the namespace, kind, name
and uid of its route. A TrainingRun's record takes the metric reports of the run's
archive with it (``metrics.jsonl``). Reading is what reading the archive is: ``get`` on
``modelversions`` in the namespace. Listings are filtered and paged here
(``records.Query``: bad values are 400, a page is at most ``records.MAX_LIMIT``).

:class:`RecordRoutes` holds the handlers; ``registry.service.create_app`` routes to them.
Tested in tests/unit/registry/test_records_service.py (with the hostile table of
``hostile.py``) and tests/integration/test_run_records.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

from aiohttp import web

from torchyard import records
from torchyard.records import Record, reader
from torchyard.registry import bodies
from torchyard.registry.access import Access

WRITE_RESOURCE = "runrecords"  # what SubjectAccessReview is asked about for a write
KIND_OF = {plural: kind for kind, plural in records.KINDS.items()}


def _too_large() -> web.HTTPException:
    return web.HTTPRequestEntityTooLarge(
        max_size=reader.MAX_RECORD_BYTES,
        actual_size=reader.MAX_RECORD_BYTES + 1,
        text=f"a record is at most {reader.MAX_RECORD_BYTES} bytes",
    )


def _refused(err: records.BadQuery) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=str(err))


class RecordRoutes:
    """Handlers of ``records/{kinds}[/{name}[/{uid}[/metrics]]]``."""

    def __init__(self, access: Access) -> None:
        self.access = access
        self.folder = reader.FolderRecords(access.store.root)

    async def put(self, request: web.Request) -> web.StreamResponse:
        """PUT a record (JSON, at most ``reader.MAX_RECORD_BYTES``): replaces that uid's."""
        ns, _ = await self.access.caller(request, "create", WRITE_RESOURCE)
        info = request.match_info
        bodies.too_large_up_front(request, reader.MAX_RECORD_BYTES, _too_large)
        raw = bytearray()
        while chunk := await request.content.read(1 << 16):
            raw += chunk
            if len(raw) > reader.MAX_RECORD_BYTES:
                raise _too_large()
        try:
            record = json.loads(raw)
        except ValueError:
            raise web.HTTPBadRequest(text="a record is a JSON object") from None
        said = {
            "namespace": ns,
            "kind": KIND_OF[info["kinds"]],
            "name": info["name"],
            "uid": info["uid"],
        }
        if not isinstance(record, dict) or any(record.get(k) != v for k, v in said.items()):
            raise web.HTTPBadRequest(
                text="the record's namespace, kind, name and uid must be its route's: "
                + json.dumps(said)
            )
        # (metric reports are a run's)
        runs = info["kinds"] == "trainingruns"
        archive = self.access.store.run_dir(ns, info["name"]) if runs else None
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self.folder.write, cast(Record, record), archive)
        except records.BadQuery as err:
            raise _refused(err) from None
        return web.json_response(said, status=201)

    async def list_(self, request: web.Request) -> web.StreamResponse:
        """GET a page of summaries, newest first (``?phase= &experiment= &labelSelector=
        &since= &limit= &continue=``)."""
        ns = await self.access.namespace(request, "get")
        q = request.query
        try:
            query = records.Query.of(
                KIND_OF[request.match_info["kinds"]],
                phase=q.get("phase"),
                experiment=q.get("experiment"),
                label_selector=q.get("labelSelector"),
                since=q.get("since"),
                limit=q.get("limit"),
                continue_token=q.get("continue"),
            )
            loop = asyncio.get_running_loop()
            summaries = await loop.run_in_executor(
                None, lambda: list(self.folder.summaries(ns, query.kind))
            )
        except records.BadQuery as err:
            raise _refused(err) from None
        return web.json_response(reader.select(summaries, query).to_json())

    def _folder(self, ns: str, info: Any) -> Any:
        try:
            found = self.folder.record_folder(
                ns, info["name"], info.get("uid"), kind=KIND_OF[info["kinds"]]
            )
        except records.BadQuery as err:
            raise _refused(err) from None
        if found is None:
            raise web.HTTPNotFound(text=f"no record of {info['name']} in {ns}")
        return self.access.inside(ns, found)

    async def get(self, request: web.Request) -> web.StreamResponse:
        """GET a record: that uid's, or the name's newest."""
        ns = await self.access.namespace(request, "get")
        return bodies.file_response(self._folder(ns, request.match_info) / reader.RECORD)

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        """GET a run's kept metric reports (``metrics.jsonl``; Range)."""
        ns = await self.access.namespace(request, "get")
        path = self._folder(ns, request.match_info) / reader.METRICS
        if not path.is_file():
            raise web.HTTPNotFound(text="the run's archive held no metric reports")
        return bodies.file_response(self.access.inside(ns, path))
