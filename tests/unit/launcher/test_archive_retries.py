"""The launcher's archive waits for a registry that is still starting (a run submitted
right after `helm install`) instead of failing the run at once."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from torchyard.launch import node_files


class _Registry(BaseHTTPRequestHandler):
    """The two requests of the registry's upload protocol: PUT (digest back), POST (commit)."""

    received: dict[str, bytes] = {}

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received[self.path.split("?")[0]] = body
        self._json({"sha256": hashlib.sha256(body).hexdigest(), "upload": "u1"})

    def do_POST(self) -> None:
        self._json({})

    def _json(self, data: dict[str, str]) -> None:
        raw = json.dumps(data).encode()
        self.send_response(201)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: object) -> None:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def late_registry() -> Iterator[tuple[int, threading.Event]]:
    """A registry that starts listening only once the test sets the event."""
    port, go, servers = _free_port(), threading.Event(), []

    def start() -> None:
        go.wait(30)
        server = ThreadingHTTPServer(("127.0.0.1", port), _Registry)
        servers.append(server)
        server.serve_forever()

    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    yield port, go
    go.set()
    for _ in range(100):
        if servers:
            break
        time.sleep(0.05)
    for server in servers:
        server.shutdown()


def test_an_upload_waits_for_a_registry_that_starts_a_moment_later(
    tmp_path: Path, late_registry: tuple[int, threading.Event]
) -> None:
    port, go = late_registry
    path = tmp_path / "model.pt"
    path.write_bytes(b"weights" * 1000)
    # The registry comes up after the first attempt was refused.
    threading.Timer(0.3, go.set).start()
    node_files._upload_retrying(
        f"http://127.0.0.1:{port}/v1/ns/runs/r/outputs/model.pt", str(path), "t"
    )
    assert _Registry.received["/v1/ns/runs/r/outputs/model.pt"] == path.read_bytes()


def test_a_registry_that_never_answers_fails_after_the_attempts_given(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    path.write_bytes(b"x")
    started = time.monotonic()
    with pytest.raises(OSError):
        node_files._upload_retrying(
            f"http://127.0.0.1:{_free_port()}/x", str(path), "t", attempts=2
        )
    # one back-off between the two attempts, not the minute of the default
    assert time.monotonic() - started < 5
    assert node_files.ARCHIVE_ATTEMPTS > 2
