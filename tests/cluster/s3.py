"""A real S3 store for the tests: SeaweedFS's S3 gateway, one process per test session.

``weed`` is built from the pinned Go module (``binaries.TOOLS["seaweedfs"]``, cached by
version like the control plane) and started as ``weed server -s3`` on free local ports
with a temporary folder and an S3 identity file (one access key and secret key allowed
everything). :class:`Store` creates buckets and puts objects with requests signed by the
fetcher's own Signature V4 code (``torchyard.inputs.s3``); the fetches under test read
them as any S3 client would. :class:`CuttingProxy` stands between a fetch and the store
and closes a connection after some bytes of its answer, as a fetch killed half way sees
it. :class:`CountingProxy` stands on an address the real node's Pods reach and records
every request (a listing, or the object and Range it asked for) and the bytes of each
answer; it can hold an object's answer half way until the test releases it, as a slow
store would. Used by tests/unit/inputs/test_s3.py, tests/node/test_s3_inputs_on_node.py
and benchmarks/inputs.py.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster import binaries
from torchyard.inputs import s3

ACCESS_KEY = "torchyard-tests"
SECRET_KEY = "torchyard-tests-secret-key"  # a test server's, on 127.0.0.1 only
READY_SECONDS = 120


def _free_port() -> int:
    """A free port whose gRPC companion (port + 10000, as weed picks it) is free too."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 10000 < 65536:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port


@dataclass(frozen=True)
class Store:
    """The running store: its endpoint, and signed requests to fill it."""

    endpoint: str
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    region: str = "us-east-1"

    def env(self, endpoint: str = "") -> dict[str, str]:
        """What a fetch reads the store with (the Secret's keys, or a shell's)."""
        return {
            "AWS_ENDPOINT_URL": endpoint or self.endpoint,
            "AWS_REGION": self.region,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
        }

    def request(self, method: str, path: str, body: bytes = b"") -> int:
        url = f"{self.endpoint}/{path}"
        headers = s3.signed_headers(
            method,
            url,
            {"x-amz-content-sha256": hashlib.sha256(body).hexdigest()},
            access_key=self.access_key,
            secret_key=self.secret_key,
            region=self.region,
            when=datetime.datetime.now(datetime.timezone.utc),
            payload_sha256=hashlib.sha256(body).hexdigest(),
        )
        request = urllib.request.Request(url, data=body or None, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                resp.read()
                return int(resp.status)
        except urllib.error.HTTPError as err:
            raise AssertionError(f"{method} {path}: HTTP {err.code}: {err.read()!r}") from None

    def bucket(self, name: str) -> None:
        self.request("PUT", name)

    def put(self, bucket: str, key: str, body: bytes) -> None:
        self.request("PUT", f"{bucket}/{urllib.request.quote(key)}", body)

    def delete(self, bucket: str, key: str) -> None:
        self.request("DELETE", f"{bucket}/{urllib.request.quote(key)}")


def _ready(store: Store, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + READY_SECONDS
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"weed exited {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            store.request("GET", "")  # ListBuckets: the gateway and its filer answer
            return
        except (AssertionError, OSError) as err:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the S3 gateway did not answer in {READY_SECONDS}s ({err}):\n"
                    f"{log.read_text()[-4000:]}"
                ) from None
            time.sleep(0.2)  # polling for readiness, not a test's timing


@contextmanager
def running(weed: Path | None = None) -> Iterator[Store]:
    """A SeaweedFS server with its S3 gateway for the ``with`` block: ``weed`` (the tests'
    ``seaweedfs`` fixture, built before them), else built here first."""
    weed = weed or binaries.build(binaries.TOOLS["seaweedfs"], log=False) / "weed"
    with tempfile.TemporaryDirectory(prefix="torchyard-s3-") as tmp:
        root = Path(tmp)
        config = root / "s3.json"
        identity = {"name": "tests", "actions": ["Admin", "Read", "List", "Tagging", "Write"]}
        identity["credentials"] = [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}]
        config.write_text(json.dumps({"identities": [identity]}))
        (root / "data").mkdir()
        ports = {name: _free_port() for name in ("master", "volume", "filer", "s3")}
        args = [
            str(weed),
            "server",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-dir={root / 'data'}",
            f"-master.port={ports['master']}",
            "-master.volumeSizeLimitMB=64",
            f"-volume.port={ports['volume']}",
            "-volume.max=100",  # each bucket is a collection of volumes of its own
            "-filer",
            f"-filer.port={ports['filer']}",
            "-s3",
            f"-s3.port={ports['s3']}",
            f"-s3.config={config}",
        ]
        log = root / "weed.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        try:
            store = Store(f"http://127.0.0.1:{ports['s3']}")
            _ready(store, proc, log)
            yield store
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class CuttingProxy:
    """A TCP proxy to ``upstream`` (host, port) that closes each connection once its
    answer has passed ``cut_after`` bytes (None: never); ``sent`` counts what it passed."""

    def __init__(self, upstream: tuple[str, int], cut_after: int | None) -> None:
        self.upstream = upstream
        self.cut_after = cut_after
        self.sent = 0
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        threading.Thread(target=_accept, args=(self._server, self._serve), daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._server.close()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(self.upstream)
        threading.Thread(target=_pump, args=(client, upstream), daemon=True).start()
        passed = 0
        with client, upstream:
            for block in _received(upstream):
                if not block:
                    return
                if self.cut_after is not None and passed + len(block) > self.cut_after:
                    block = block[: self.cut_after - passed]
                    client.sendall(block)
                    self.sent += len(block)
                    return
                client.sendall(block)
                passed += len(block)
                self.sent += len(block)


def _received(sock: socket.socket) -> Iterator[bytes]:
    """The blocks ``sock`` receives until it closes: b"" last when it closed cleanly,
    nothing more after an error."""
    while True:
        try:
            block = sock.recv(1 << 16)
        except OSError:
            return
        yield block
        if not block:
            return


def _accept(server: socket.socket, serve: Callable[[socket.socket], None]) -> None:
    """Serve each connection ``server`` accepts in a thread of its own, until it is closed."""
    while True:
        try:
            client, _ = server.accept()
        except OSError:
            return
        threading.Thread(target=serve, args=(client,), daemon=True).start()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while block := src.recv(1 << 16):
            dst.sendall(block)
    except OSError:
        pass


@dataclass
class Served:
    """One request the store answered through a :class:`CountingProxy`."""

    listing: bool  # a ListObjectsV2 (else a GET of ``key``)
    key: str
    range: str  # the Range header ('' when it asked for the whole object)
    answered: int = 0  # the bytes of the answer passed on (head and body)
    finished: bool = False  # the store's answer ended and was all passed on


@dataclass
class CountingProxy:
    """An HTTP proxy on ``host`` (all addresses: the node's Pods reach it) to the store at
    ``upstream``, one request per connection (the fetcher sends ``Connection: close``).
    ``served``: every request, in order. While ``hold_key`` is set and not released, the
    answer for that key stops after ``hold_after`` bytes until :meth:`release`."""

    upstream: tuple[str, int]
    hold_key: str = ""
    hold_after: int = 0
    served: list[Served] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._released = threading.Event()
        self._lock = threading.Lock()
        self._server = socket.create_server(("0.0.0.0", 0))
        self.port = int(self._server.getsockname()[1])
        threading.Thread(target=_accept, args=(self._server, self._serve), daemon=True).start()

    def release(self) -> None:
        self._released.set()

    def close(self) -> None:
        self._released.set()
        self._server.close()

    def listings(self) -> int:
        with self._lock:
            return sum(1 for s in self.served if s.listing)

    def gets(self, key: str) -> list[Served]:
        with self._lock:
            return [s for s in self.served if not s.listing and s.key == key]

    def _record(self, head: bytes) -> Served:
        lines = head.decode("latin-1").split("\r\n")
        target = lines[0].split(" ")[1]
        path, _, query = target.partition("?")
        headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
        ranged = {k.strip().lower(): v.strip() for k, v in headers.items()}.get("range", "")
        key = urllib.request.unquote(path.lstrip("/").partition("/")[2])
        served = Served("list-type=2" in query, key, ranged)
        with self._lock:
            self.served.append(served)
        return served

    def _serve(self, client: socket.socket) -> None:
        head = b""
        with client:
            while b"\r\n\r\n" not in head:
                block = client.recv(1 << 16)
                if not block:
                    return
                head += block
            served = self._record(head)
            with socket.create_connection(self.upstream) as upstream:
                upstream.sendall(head)
                self._answer(served, upstream, client)

    def _answer(self, served: Served, upstream: socket.socket, client: socket.socket) -> None:
        held = served.key == self.hold_key and not served.listing
        for block in _received(upstream):
            if not block:
                served.finished = True
                return
            if held and not self._released.is_set():
                room = max(0, self.hold_after - served.answered)
                if len(block) > room:
                    if not self._send(client, served, block[:room]):
                        return
                    block = block[room:]
                    self._released.wait()
            if not self._send(client, served, block):
                return

    def _send(self, client: socket.socket, served: Served, block: bytes) -> bool:
        try:
            client.sendall(block)
        except OSError:
            return False
        served.answered += len(block)
        return True
