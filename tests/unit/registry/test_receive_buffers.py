"""An upload larger than the service's buffers (``bodies.CHUNK``), cut at odd places, is
stored and hashed byte for byte: the thread of the upload that hashes and writes what the
event loop read keeps the body's order, and the launcher's one-pass upload confirms the
service's digest, through TLS in large blocks."""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import os
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.unit.registry.test_service import WRITER, A, Served, StandIn
from tests.unit.registry.test_tls_and_tokens import make_pki
from torchyard.launch.node_files import upload_file
from torchyard.registry import Store, service
from torchyard.registry.bodies import CHUNK
from torchyard.registry.service import Limits


@pytest.fixture
def big(tmp_path: Path) -> Iterator[Served]:
    svc = Served(tmp_path / "registry", StandIn(), Limits(upload_bytes=64 << 20))
    yield svc
    svc.stop()


def pieces(data: bytes, size: int) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


@pytest.mark.parametrize("piece", [1, 1_000_003, CHUNK, CHUNK + 1])
def test_a_body_of_several_buffers_is_stored_and_hashed_in_order(big: Served, piece: int) -> None:
    # Every buffer differs (a swapped or repeated one would change the file), and the body
    # ends part-way into a buffer; one-byte pieces (one socket read each) on a smaller body.
    data = os.urandom(2 * CHUNK + 12345) if piece > 1 else os.urandom(3 * 4096 + 7)
    conn = http.client.HTTPConnection("127.0.0.1", big.port, timeout=60)
    conn.request(
        "PUT",
        f"/v1/namespaces/{A}/runs/r/outputs/model.bin",
        body=pieces(data, piece),
        headers={
            "Authorization": f"Bearer {WRITER}",
            "X-Content-SHA256": hashlib.sha256(data).hexdigest(),
        },
        encode_chunked=True,
    )
    resp = conn.getresponse()
    answer = resp.read()
    conn.close()
    assert resp.status == 201, answer
    assert hashlib.sha256(data).hexdigest().encode() in answer
    assert (big.root / A / "runs/r/outputs/model.bin").read_bytes() == data


def test_the_launchers_upload_of_several_buffers_is_confirmed(big: Served, tmp_path: Path) -> None:
    data = os.urandom(3 * CHUNK - 1)
    src = tmp_path / "model.bin"
    src.write_bytes(data)
    url = f"http://127.0.0.1:{big.port}/v1/namespaces/{A}/runs/r/outputs/model.bin"
    upload_file(url, str(src), WRITER)
    assert (big.root / A / "runs/r/outputs/model.bin").read_bytes() == data


def test_an_upload_through_tls_is_sent_in_large_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No sendfile through TLS, and SSLSocket.sendfile's fallback sends 8 KiB at a time:
    # 9 MiB went in 9 sends of 1 MiB (the fallback would make over a thousand).
    pki = make_pki(tmp_path / "pki", "registry")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(pki.cert, pki.key)
    loop = asyncio.new_event_loop()
    app = service.create_app(Store(tmp_path / "registry"), StandIn(), Limits(64 << 20))
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server).start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    sends: list[int] = []
    real = ssl.SSLSocket.sendall

    def counted(sock: ssl.SSLSocket, data: Any, *args: Any) -> None:
        sends.append(len(data))
        real(sock, data, *args)

    monkeypatch.setattr(ssl.SSLSocket, "sendall", counted)
    data = os.urandom(9 << 20)
    src = tmp_path / "model.bin"
    src.write_bytes(data)
    context = ssl.create_default_context(cadata=pki.ca_pem)
    try:
        url = f"https://127.0.0.1:{port}/v1/namespaces/{A}/runs/r/outputs/model.bin"
        upload_file(url, str(src), WRITER, context)
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
    assert (tmp_path / "registry" / A / "runs/r/outputs/model.bin").read_bytes() == data
    body = [n for n in sends if n == 1 << 20]
    assert len(body) == 9 and len(sends) < 20, sends[:20]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_client_that_goes_away_mid_upload_leaves_no_file_and_no_open_fd(
    big: Served,
) -> None:
    before = open_fds()
    outputs = big.root / A / "runs/r/outputs"
    conn = http.client.HTTPConnection("127.0.0.1", big.port, timeout=60)
    conn.putrequest("PUT", f"/v1/namespaces/{A}/runs/r/outputs/model.bin")
    conn.putheader("Authorization", f"Bearer {WRITER}")
    conn.putheader("Content-Length", str(12 << 20))
    conn.endheaders()
    assert conn.sock is not None
    conn.sock.sendall(os.urandom(3 * CHUNK // 2))  # half of what it announced
    deadline = time.monotonic() + 30
    while not (outputs.exists() and any(outputs.iterdir())):  # the upload has begun
        assert time.monotonic() < deadline, "the service never started the upload"
        time.sleep(0.01)
    conn.close()
    while any(outputs.iterdir()) or open_fds() > before:
        assert time.monotonic() < deadline, (list(outputs.iterdir()), open_fds(), before)
        time.sleep(0.05)
    # and the service still takes uploads
    code, _ = big.call("PUT", f"/v1/namespaces/{A}/runs/r/outputs/ok.bin", WRITER, b"x" * 10)
    assert code == 201
