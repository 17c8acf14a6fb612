"""A local HTTP server for the fetcher's tests: files from a dict, Range requests served
(or not), the bytes it sent counted, and a way to cut a body short (a fetch killed half
way); :func:`entry_files`, what a cache entry holds; and :func:`archive`, an archive of
each suffix the fetcher unpacks."""

from __future__ import annotations

import http.server
import io
import os
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from torchyard.inputs import cache


def entry_files(root: str, key: str) -> dict[str, bytes]:
    """The files of the cache entry ``key`` under ``root``, by path in the entry."""
    data = cache.data_dir(root, key)
    found = {}
    for folder, _, names in os.walk(data):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, data)] = f.read()
    return found


# The tarfile mode that writes each tar suffix of ``archives.SUFFIXES``.
TAR_MODES = {
    ".tar": "w:",
    ".tar.gz": "w:gz",
    ".tgz": "w:gz",
    ".tar.bz2": "w:bz2",
    ".tbz2": "w:bz2",
    ".tar.xz": "w:xz",
    ".txz": "w:xz",
}


def archive(suffix: str, files: dict[str, bytes]) -> bytes:
    """An archive of ``files`` (path: content) as a file named ``*<suffix>`` holds it."""
    buf = io.BytesIO()
    if suffix == ".zip":
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            for name, data in files.items():
                z.writestr(name, data)
        return buf.getvalue()
    with tarfile.open(fileobj=buf, mode=TAR_MODES[suffix]) as tar:  # type: ignore[call-overload]
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@dataclass
class Files:
    files: dict[str, bytes] = field(default_factory=dict)
    status: dict[str, int] = field(default_factory=dict)  # path -> HTTP status to answer
    ranges: bool = True
    cut_after: int | None = None  # send at most this many body bytes, then close
    sent: int = 0
    requests: list[tuple[str, str]] = field(default_factory=list)  # (path, Range header)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _handler(state: Files) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            wanted = self.headers.get("Range", "")
            state.requests.append((path, wanted))
            if path in state.status:
                self.send_error(state.status[path])
                return
            body = state.files.get(path)
            if body is None:
                self.send_error(404)
                return
            start = 0
            if wanted.startswith("bytes=") and state.ranges:
                start = int(wanted[6:].split("-", 1)[0])
                if start >= len(body):
                    self.send_error(416)
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            else:
                self.send_response(200)
            chunk = body[start:]
            self.send_header("Content-Length", str(len(chunk)))
            self.end_headers()
            if state.cut_after is not None:
                chunk = chunk[: state.cut_after]
            # counted before it is written: a client that has read the whole body may
            # look at the count before this thread runs again
            with state.lock:
                state.sent += len(chunk)
            self.wfile.write(chunk)
            if state.cut_after is not None:
                self.close_connection = True

    return Handler


@contextmanager
def serving(state: Files, host: str = "127.0.0.1") -> Iterator[str]:
    """``http://<host>:<port>`` serving ``state`` until the block ends (another ``host``
    than loopback: for a Pod on the real node)."""
    server = http.server.ThreadingHTTPServer((host, 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
