"""The SDK's download (``RegistryClient._stream``) of a body of any size, announced or not:
one that fits a buffer (``sdk.registry.BUFFER``) is taken in one read, a larger one in
rotating buffers hashed and written by two threads; either way the file arrives byte for
byte, its sha256 is checked before it is renamed into place, and a body that is cut
short, or does not match, leaves nothing behind."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.unit.registry.test_service import WRITER, A, Served, StandIn
from torchyard.registry.service import Limits
from torchyard.sdk.registry import BUFFER, RegistryClient, RegistryError

SIZES = [0, 1, BUFFER - 1, BUFFER, BUFFER + 1, 2 * BUFFER + 12345]


@pytest.fixture
def big(tmp_path: Path) -> Iterator[Served]:
    svc = Served(tmp_path / "registry", StandIn(), Limits(upload_bytes=64 << 20))
    yield svc
    svc.stop()


def nothing_left(folder: Path) -> bool:
    return not any(folder.iterdir())


@pytest.mark.parametrize("size", SIZES)
def test_a_file_of_any_size_arrives_whole_and_checked(
    big: Served, tmp_path: Path, size: int
) -> None:
    data = os.urandom(size)
    code, _ = big.call("PUT", f"/v1/namespaces/{A}/runs/r/outputs/m.bin", WRITER, data)
    assert code == 201
    client = RegistryClient(f"http://127.0.0.1:{big.port}", WRITER)
    out = tmp_path / "out"
    sha = hashlib.sha256(data).hexdigest()
    client.download_run_file(A, "r", "outputs/m.bin", out / "m.bin", sha)
    assert (out / "m.bin").read_bytes() == data
    with pytest.raises(RegistryError, match="does not match"):
        client.download_run_file(A, "r", "outputs/m.bin", out / "bad.bin", "0" * 64)
    assert sorted(p.name for p in out.iterdir()) == ["m.bin"]


class Odd:
    """A server of one body, sent ``how``: 'chunked' (no length), 'no-length' (read to
    the close), 'bad-length' (a Content-Length that is no number: read to the close) or
    'short' (a Content-Length one byte more than it sends, then the close)."""

    def __init__(self, data: bytes, how: str) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if how == "chunked" else "HTTP/1.0"

            def do_GET(self) -> None:
                self.send_response(200)
                if how == "chunked":
                    self.send_header("Transfer-Encoding", "chunked")
                elif how == "bad-length":
                    self.send_header("Content-Length", "lots")
                elif how == "short":
                    self.send_header("Content-Length", str(len(data) + 1))
                self.send_header("Connection", "close")
                self.end_headers()
                if how != "chunked":
                    self.wfile.write(data)
                    return
                for i in range(0, len(data), 1_000_003):
                    piece = data[i : i + 1_000_003]
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.write(b"0\r\n\r\n")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def odd() -> Iterator[Any]:
    servers: list[Odd] = []

    def start(data: bytes, how: str) -> Odd:
        servers.append(Odd(data, how))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@pytest.mark.parametrize("size", [10, 2 * BUFFER + 7])
@pytest.mark.parametrize("how", ["chunked", "no-length", "bad-length"])
def test_a_body_without_a_usable_length_is_read_to_its_end_and_checked(
    odd: Any, tmp_path: Path, how: str, size: int
) -> None:
    data = os.urandom(size)
    client = RegistryClient(odd(data, how).url, "t")
    dest = tmp_path / "m.bin"
    client.download_run_file("ns", "r", "outputs/m.bin", dest, hashlib.sha256(data).hexdigest())
    assert dest.read_bytes() == data


@pytest.mark.parametrize("size", [10, BUFFER - 1, 2 * BUFFER + 7])
def test_a_body_cut_short_of_its_length_is_refused_even_without_a_digest(
    odd: Any, tmp_path: Path, size: int
) -> None:
    client = RegistryClient(odd(os.urandom(size), "short").url, "t")
    with pytest.raises(RegistryError, match=f"ended after {size} of {size + 1} bytes"):
        client.download_run_file("ns", "r", "outputs/m.bin", tmp_path / "m.bin")
    assert nothing_left(tmp_path)
