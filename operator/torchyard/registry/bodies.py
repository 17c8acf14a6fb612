"""Request and response bodies of the registry service: files streamed in and out.

:func:`receive` streams an upload into a new temporary file while hashing it: the event
loop reads the socket while a thread of the upload hashes and writes each chunk read
before (the registry's throughput is measured by ``benchmarks/registry_throughput.py``
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
import contextlib
import hashlib
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from torchyard.registry.store import MAX_SNAPSHOT_BYTES, MAX_UPLOAD_BYTES, human_size

CHUNK = 4 << 20
# An upload's bytes read but not yet written (``_Sink``): the loop waits above HIGH_WATER
# until the thread is down to LOW_WATER.
HIGH_WATER, LOW_WATER = 2 * CHUNK, CHUNK
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


class _Sink:
    """A thread of one upload that hashes each chunk the event loop hands it and then
    writes it, in order, fsyncs the file at the end and closes it (the thread owns the
    file descriptor: however the request ends, nothing closes it under a write).

    The loop only queues chunks (no copy, no wake-up of the loop per chunk), so it reads
    the socket while the thread hashes and writes (hashlib and ``os.write`` release the
    GIL): each chunk is hashed and written while it is still in the CPU's cache, where
    batches of megabytes would be read back from memory twice. When more than
    ``HIGH_WATER`` bytes wait, the loop waits until the thread is down to ``LOW_WATER``,
    so memory stays flat in the file size. An error of the thread (a full volume) is
    raised to the loop at its next chunk, or at the end."""

    def __init__(self, fd: int, loop: asyncio.AbstractEventLoop) -> None:
        self.fd, self.loop = fd, loop
        self.digest = hashlib.sha256()
        self.chunks: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.waiting = 0  # bytes queued, not yet written
        self.resume: asyncio.Future[None] | None = None  # the loop waits for room
        self.error: BaseException | None = None
        self.abandoned = False  # the upload failed: drain the queue, write nothing
        self.finished: asyncio.Future[None] = loop.create_future()
        threading.Thread(target=self._run, name="registry-upload", daemon=True).start()

    async def put(self, chunk: bytes) -> None:
        """Hand ``chunk`` over (loop thread); wait while too much is queued."""
        if self.error is not None:
            raise self.error
        with self.lock:
            self.waiting += len(chunk)
            if self.waiting > HIGH_WATER:
                self.resume = self.loop.create_future()
            resume = self.resume
        self.chunks.put(chunk)
        if resume is not None:
            await resume

    async def close(self, *, abandon: bool = False) -> None:
        """No more chunks: wait until every one is written, the file fsynced and closed
        (with ``abandon``: until the thread stopped, having written no more)."""
        self.abandoned = self.abandoned or abandon
        self.chunks.put(None)
        await asyncio.shield(self.finished)  # a cancelled request leaves the thread be
        if self.error is not None and not abandon:
            raise self.error

    def _run(self) -> None:
        try:
            while (chunk := self.chunks.get()) is not None:
                if not self.abandoned and self.error is None:
                    try:
                        self.digest.update(chunk)
                        view = memoryview(chunk)
                        while view:
                            view = view[os.write(self.fd, view) :]
                    except OSError as err:
                        self.error = err
                with self.lock:
                    self.waiting -= len(chunk)
                    resume = self.resume
                    if resume is not None and (self.waiting <= LOW_WATER or self.error):
                        self.resume = None
                    else:
                        resume = None
                if resume is not None:
                    self._tell(resume)
            if not self.abandoned and self.error is None:
                os.fsync(self.fd)
        except OSError as err:
            self.error = err
        finally:
            os.close(self.fd)
            self._tell(self.finished)

    def _tell(self, future: asyncio.Future[None]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: the service is stopping
            self.loop.call_soon_threadsafe(_release, future)


def _release(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def receive(
    request: web.Request, tmp: Path, limit: int, too_large: Callable[[], web.HTTPException]
) -> tuple[int, str]:
    """Stream the request body into ``tmp`` (new), hashing it; fsynced. (size, sha256)
    ``too_large`` is raised as soon as more than ``limit`` bytes came (a chunked body has
    no Content-Length to check up front); the caller removes ``tmp``. The event loop
    reads, a thread of this upload hashes and writes (:class:`_Sink`)."""
    size = 0
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        sink = _Sink(fd, asyncio.get_running_loop())  # it closes fd from now on
    except BaseException:
        os.close(fd)
        raise
    try:
        async for chunk in request.content.iter_any():
            size += len(chunk)
            if size > limit:
                raise too_large()
            await sink.put(chunk)
    except BaseException:
        await sink.close(abandon=True)
        raise
    await sink.close()
    return size, sink.digest.hexdigest()


def file_response(path: Path) -> web.StreamResponse:
    """The file at ``path`` (404 when there is none), streamed; Range requests get 206."""
    if not path.is_file():
        raise web.HTTPNotFound(text="no such file")
    # FileResponse streams in chunks and answers Range requests (206) by itself.
    return web.FileResponse(path, chunk_size=CHUNK)
