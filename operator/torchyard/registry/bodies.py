"""Request and response bodies of the registry service: files streamed in and out.

:func:`receive` streams an upload into a new temporary file while hashing it, in 4 MiB
batches that one thread writes while another hashes them and the event loop reads the
next (the registry's throughput is measured by ``benchmarks/registry_throughput.py``
against a hashed local copy), refuses it with 413 as soon as it passes its limit
(:class:`Limits`: a chunked body has no Content-Length to check up front), and fsyncs it;
memory stays flat in the file size. :func:`file_response` streams a file back and answers
HTTP Range requests.

Used by ``registry.archives`` (run files, source snapshots) and ``registry.versions``
(model files, a promotion's JSON body); tested in ``tests/unit/registry/test_service.py``
and ``tests/integration/test_registry_service.py``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from torchyard.registry.store import MAX_SNAPSHOT_BYTES, MAX_UPLOAD_BYTES, human_size

CHUNK = 4 << 20
MAX_JSON_BODY = 1 << 20  # a promotion's JSON body


def _too_large(what: str, limit: int, flag: str, helm: str) -> web.HTTPRequestEntityTooLarge:
    return web.HTTPRequestEntityTooLarge(
        limit,
        text=f"{what} is larger than the registry's limit of {human_size(limit)} "
        f"({limit} bytes): raise it with `torchyard registry serve {flag}` "
        f"(Helm value {helm})",
    )


@dataclass(frozen=True)
class Limits:
    """The largest bodies the service takes (``torchyard registry serve
    --max-upload-bytes/--max-snapshot-bytes``, Helm ``registry.maxUploadBytes`` and
    ``registry.maxSnapshotBytes``); larger ones get 413 and leave nothing behind."""

    upload_bytes: int = MAX_UPLOAD_BYTES
    snapshot_bytes: int = MAX_SNAPSHOT_BYTES

    # A new exception each time: an aiohttp HTTPException is the response it sends.
    def upload_too_large(self) -> web.HTTPException:
        return _too_large(
            "the file", self.upload_bytes, "--max-upload-bytes", "registry.maxUploadBytes"
        )

    def snapshot_too_large(self) -> web.HTTPException:
        return _too_large(
            "the source snapshot",
            self.snapshot_bytes,
            "--max-snapshot-bytes",
            "registry.maxSnapshotBytes",
        )


def too_large_up_front(
    request: web.Request, limit: int, error: Callable[[], web.HTTPException]
) -> None:
    """Raise ``error()`` when the request's Content-Length already says it is too large."""
    if request.content_length is not None and request.content_length > limit:
        raise error()


async def receive(
    request: web.Request, tmp: Path, limit: int, too_large: Callable[[], web.HTTPException]
) -> tuple[int, str]:
    """Stream the request body into ``tmp`` (new), hashing it; fsynced. (size, sha256)
    ``too_large`` is raised as soon as more than ``limit`` bytes came (a chunked body has
    no Content-Length to check up front); the caller removes ``tmp``."""
    digest = hashlib.sha256()
    size = 0
    loop = asyncio.get_running_loop()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    pending: list[asyncio.Future[None]] = []
    try:

        def write(chunks: list[bytes]) -> None:
            for chunk in chunks:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]

        def hash_(chunks: list[bytes]) -> None:
            for chunk in chunks:
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
                # A batch is written and hashed in two threads at once (both release the
                # GIL) while the loop reads the next; each waits for the previous batch,
                # so the file and the digest keep the body's order.
                for future in pending:
                    await future
                pending = [
                    loop.run_in_executor(None, write, batch),
                    loop.run_in_executor(None, hash_, batch),
                ]
                batch, batched = [], 0
        for future in pending:
            await future
        write(batch)
        hash_(batch)
        await loop.run_in_executor(None, os.fsync, fd)
    finally:
        if not all(f.done() for f in pending):
            await asyncio.wait(pending)  # never close fd under a write in flight
        os.close(fd)
    return size, digest.hexdigest()


def file_response(path: Path) -> web.StreamResponse:
    """The file at ``path`` (404 when there is none), streamed; Range requests get 206."""
    if not path.is_file():
        raise web.HTTPNotFound(text="no such file")
    # FileResponse streams in chunks and answers Range requests (206) by itself.
    return web.FileResponse(path, chunk_size=CHUNK)
