"""RegistryClient.download against a tampered manifest, served by a tiny local HTTP server:
a file path that is absolute, has ``..`` or leads out of the folder through a link is
refused before anything is written."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from torchyard.sdk.registry import RegistryClient, RegistryError

DATA = b"model bytes"
SHA = hashlib.sha256(DATA).hexdigest()


class FakeRegistry:
    """Answers the three GETs of a download; ``files`` is what the manifest lists."""

    def __init__(self) -> None:
        self.files: list[dict[str, Any]] = []
        self.fetched: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.endswith("/models"):
                    body = json.dumps({"models": {"m": [1]}}).encode()
                elif self.path.endswith("/versions/1"):
                    body = json.dumps({"version": 1, "files": owner.files}).encode()
                else:
                    owner.fetched.append(self.path)
                    body = DATA
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake() -> Iterator[FakeRegistry]:
    server = FakeRegistry()
    yield server
    server.stop()


def entry(path: Any) -> dict[str, Any]:
    return {"path": path, "size": len(DATA), "sha256": SHA}


def test_a_good_manifest_downloads(fake: FakeRegistry, tmp_path: Path) -> None:
    fake.files = [entry("model.pt"), entry("sub/config.json")]
    RegistryClient(fake.url, "t").download("ns", "m", None, tmp_path / "out")
    assert (tmp_path / "out" / "sub" / "config.json").read_bytes() == DATA


@pytest.mark.parametrize(
    "evil",
    [
        "../escape.pt",
        "sub/../../escape.pt",
        "/tmp/torchyard-absolute.pt",
        "..",
        "",
        "a//b",
        "a\\..\\..\\escape.pt",
        "x\x00y",
        None,
        {"path": "x"},
    ],
)
def test_a_path_leaving_the_folder_is_refused_before_anything_is_written(
    fake: FakeRegistry, tmp_path: Path, evil: Any
) -> None:
    dest = tmp_path / "out"
    fake.files = [entry("first.pt"), entry(evil)]
    with pytest.raises(RegistryError, match="outside the download folder"):
        RegistryClient(fake.url, "t").download("ns", "m", None, dest)
    assert fake.fetched == [] and not dest.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    with pytest.raises(RegistryError, match="outside the download folder"):
        RegistryClient(fake.url, "t").verify("ns", "m")


def test_a_link_in_the_folder_is_not_followed_out(fake: FakeRegistry, tmp_path: Path) -> None:
    dest, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    dest.mkdir()
    elsewhere.mkdir()
    (dest / "sub").symlink_to(elsewhere)
    fake.files = [entry("sub/model.pt")]
    with pytest.raises(RegistryError, match="outside the download folder"):
        RegistryClient(fake.url, "t").download("ns", "m", None, dest)
    assert list(elsewhere.iterdir()) == []


def test_a_manifest_without_digests_is_refused(fake: FakeRegistry, tmp_path: Path) -> None:
    fake.files = [{"path": "model.pt", "size": 1, "sha256": "not-a-digest"}]
    with pytest.raises(RegistryError, match="has no sha256"):
        RegistryClient(fake.url, "t").download("ns", "m", None, tmp_path / "out")
    assert not (tmp_path / "out").exists()
