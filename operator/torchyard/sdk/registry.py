"""The SDK's and CLI's client of the model registry service: the one HTTP client of
``torchyard.registry.client`` (models, manifests, promote, run files) plus downloads
(sha256-verified), verify, source snapshots, and tokens minted through Kubernetes.

Talks HTTP(S) to the service (``TORCHYARD_REGISTRY_URL`` or an explicit URL) with a token
bound to the registry's audience (``torchyard-registry``): from a file, from
``TORCHYARD_TOKEN``, or minted for a ServiceAccount through the TokenRequest API (RBAC:
``create`` on ``serviceaccounts/token``). The kubeconfig's own credentials only ever go
to the apiserver. An https URL is verified against ``ca_file``, ``TORCHYARD_REGISTRY_CA``
(the PEM the operator gives node Pods) or ``TORCHYARD_REGISTRY_CA_FILE``, else the
system's CAs. Downloads stream in 256 KiB blocks, hashed and written by a thread while
the next are read, and are checked against the manifest's sha256 before they are renamed
into place.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import queue
import re
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchyard.api import wire
from torchyard.launch.contract import (
    TORCHYARD_REGISTRY_CA,
    TORCHYARD_REGISTRY_CA_FILE,
    TORCHYARD_REGISTRY_URL,
    TORCHYARD_TOKEN,
)
from torchyard.registry import client
from torchyard.registry.client import TOKEN_HEADER
from torchyard.registry.client import RegistryError as RegistryError  # (re-exported)
from torchyard.sdk.progress import Progress

CHUNK = 1 << 20
BUFFER = 256 << 10  # what a download reads at a time (_receive): it stays in the CPU's cache
RING = 8  # buffers read ahead of the thread that hashes and writes them
REPORT_EVERY = 4 * CHUNK  # bytes between two progress updates

# Where the Helm chart puts the registry service: ``[http:|https:]NS/NAME:PORT``, https
# (the chart's registry.tls.enabled) unless it says ``http:``.
DEFAULT_SERVICE = "torchyard-system/torchyard-registry:8080"
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # a namespace's, a Service's


class RegistryClient(client.RegistryClient):
    """``url`` + ``token``: talk to the service directly (in the cluster, or a port you
    reach). :meth:`through_kubernetes`: through the apiserver's service proxy, with a
    registry token minted for a ServiceAccount."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        ca_file: str | None = None,
        headers: dict[str, str] | None = None,
        token_header: str = "Authorization",
    ) -> None:
        url = url or os.environ.get(TORCHYARD_REGISTRY_URL)
        if not url:
            raise RegistryError(
                "no registry service: pass --registry-url or set TORCHYARD_REGISTRY_URL"
            )
        if ssl_context is None and url.startswith("https:"):
            ssl_context = _registry_context(ca_file)
        super().__init__(
            url,
            token or os.environ.get(TORCHYARD_TOKEN, ""),
            ssl_context=ssl_context,
            headers=headers,
            token_header=token_header,
        )
        self.progress = False  # progress bars on standard error for files over 1 MiB

    @classmethod
    def for_service_account(
        cls, url: str | None, namespace: str, name: str, *, ca_file: str | None = None
    ) -> RegistryClient:
        """Direct to ``url`` with a 10-minute registry token of ServiceAccount ``name``."""
        return cls(url, _service_account_token(namespace, name), ca_file=ca_file)

    @classmethod
    def through_kubernetes(
        cls,
        namespace: str,
        service_account: str | None = None,
        service: str = DEFAULT_SERVICE,
    ) -> RegistryClient:
        """Reach the service at ``service`` (``[http:|https:]NS/NAME:PORT``, https unless
        it says http) through the apiserver's service proxy. The kubeconfig authenticates
        to the apiserver only; the registry sees a 10-minute token of ``service_account``
        (the namespace's ``default`` unless named) that TokenRequest mints for the
        registry's audience (the kubeconfig's user needs ``create`` on
        ``serviceaccounts/token`` for it; the ServiceAccount ``get``/``create`` on
        ``modelversions``). No kubeconfig, or an apiserver that does not answer, raises
        ``k8s.Unreachable``, with the same advice as every other call to the API."""
        from torchyard import k8s

        scheme, ref = "https", service
        if service.startswith(("http:", "https:")):
            scheme, _, ref = service.partition(":")
        svc_ns, _, rest = ref.partition("/")
        name, _, port = rest.partition(":")
        if not (_LABEL.match(svc_ns) and _LABEL.match(name) and port.isdigit()):
            raise RegistryError(
                f"--registry-service {service!r}: expected [http:|https:]NAMESPACE/NAME:PORT"
            )
        conn = k8s.connection()  # (k8s.Unreachable, as every command's: no kubeconfig ...)
        token = _service_account_token(namespace, service_account or "default")
        url = conn.host + k8s.proxy_url(svc_ns, name, int(port), scheme=scheme)
        return cls(
            url,
            token,
            ssl_context=conn.ssl_context,
            headers=conn.headers,
            token_header=TOKEN_HEADER,
        )

    def _stream(self, path: str, dest: Path | None, sha256: str | None) -> str:
        """Download ``path`` (to ``dest`` when given); returns the sha256, checked if known."""
        digest = hashlib.sha256()
        tmp = None
        if dest is not None:
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.part")
        try:
            with self._open(path) as resp:
                # O_NOFOLLOW: a link planted at the temporary name is not written through
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
                fd = os.open(tmp, flags, 0o644) if tmp else -1
                # http.client's reading of Content-Length: None when there is none (chunked)
                # or it is no length; the body is never read past it
                size: int | None = getattr(resp, "length", None)
                bar = (
                    Progress(f"downloading {path.rsplit('/', 1)[-1]}", size)
                    if self.progress and size and size > CHUNK
                    else None
                )
                try:
                    read = _receive(resp, digest, fd, bar.update if bar else None, size)
                    if size is not None and read != size:  # the connection closed early
                        raise RegistryError(f"{path}: the body ended after {read} of {size} bytes")
                    if bar:
                        bar.done()
                    if fd >= 0:
                        os.fsync(fd)
                finally:
                    if fd >= 0:
                        os.close(fd)
            got = digest.hexdigest()
            if sha256 and got != sha256:
                raise RegistryError(f"{path}: sha256 {got} does not match the manifest's {sha256}")
            if tmp is not None and dest is not None:
                os.replace(tmp, dest)
            return got
        finally:
            if tmp is not None and tmp.exists():
                tmp.unlink()

    def download(
        self, namespace: str, model: str, version: int | None, dest: Path
    ) -> dict[str, Any]:
        """Every file of a version into ``dest``, each checked against its sha256. The
        manifest is checked first: a file path that is absolute, has a ``..`` or leads out
        of ``dest`` (through a link already there) is refused before anything is written."""
        manifest = self.manifest(namespace, model, version)
        entries = _entries(manifest, dest)
        base = f"/v1/namespaces/{namespace}/models/{model}/versions/{manifest['version']}/files/"
        for path, sha256, target in entries:
            self._stream(base + path, target, sha256)
        return manifest

    def verify(
        self, namespace: str, model: str, version: int | None = None
    ) -> tuple[dict[str, Any], list[str]]:
        """(manifest, files whose content does not match it) without saving anything."""
        manifest = self.manifest(namespace, model, version)
        base = f"/v1/namespaces/{namespace}/models/{model}/versions/{manifest['version']}/files/"
        bad = []
        for path, sha256, _ in _entries(manifest, None):
            if self._stream(base + path, None, None) != sha256:
                bad.append(path)
        return manifest, bad

    # -- source snapshots ---------------------------------------------------------------

    def put_snapshot(
        self, namespace: str, archive: Path, sha256: str, progress: Progress | None = None
    ) -> bool:
        """Upload a source snapshot unless the service has it; True when it was sent."""
        path = f"/v1/namespaces/{namespace}/snapshots/{sha256}"
        try:
            self._open(path, method="HEAD").close()
            return False
        except RegistryError as err:
            if not str(err).startswith("404"):
                raise
        size = archive.stat().st_size
        with archive.open("rb") as f:
            body = _Reader(f, progress)
            with self._open(
                path, method="PUT", data=body, headers={"Content-Length": str(size)}
            ) as resp:
                resp.read()
        if progress:
            progress.done()
        return True

    # -- runs -------------------------------------------------------------------------

    def download_run_file(
        self, namespace: str, run: str, path: str, dest: Path, sha256: str | None = None
    ) -> Path:
        """A run's archived file (``outputs/...`` or ``logs/node-N/...``), ~ run.download_file;
        checked against ``sha256`` when given."""
        if not path.startswith(("outputs/", "logs/")):
            raise RegistryError("the path starts with outputs/ or logs/")
        self._stream(f"/v1/namespaces/{namespace}/runs/{run}/{path}", dest, sha256)
        return dest


def _service_account_token(namespace: str, name: str) -> str:
    """A 10-minute token of ServiceAccount ``namespace/name`` for the registry's audience."""
    from torchyard import k8s

    try:
        return k8s.request_token(namespace, name, [wire.REGISTRY_AUDIENCE])
    except k8s.ApiError as err:
        if err.status == 403:
            raise RegistryError(
                f"you may not get a registry token of ServiceAccount {namespace}/{name}: "
                f"TokenRequest needs 'create' on 'serviceaccounts/token' (resourceName "
                f"{name}) in namespace {namespace}. Ask an admin for it, e.g. "
                f"kubectl -n {namespace} create role registry-token --verb=create "
                f"--resource=serviceaccounts/token --resource-name={name}, and a RoleBinding "
                f"to you; or name a ServiceAccount you may use (--service-account)"
            ) from None
        if err.not_found:
            raise RegistryError(
                f"ServiceAccount {namespace}/{name} does not exist: name one that does "
                f"(--service-account), or create it and let it get/create modelversions"
            ) from None
        raise RegistryError(
            f"cannot get a registry token of ServiceAccount {namespace}/{name} "
            f"(TokenRequest): {err.status} {err.message}"
        ) from None


def _registry_context(ca_file: str | None = None) -> ssl.SSLContext:
    """Verifies the registry's certificate: against ``ca_file``, else the PEM in
    ``TORCHYARD_REGISTRY_CA``, else the file ``TORCHYARD_REGISTRY_CA_FILE``, else the
    system's CAs."""
    pem = None if ca_file else os.environ.get(TORCHYARD_REGISTRY_CA) or None
    cafile = ca_file or (None if pem else os.environ.get(TORCHYARD_REGISTRY_CA_FILE) or None)
    try:
        return ssl.create_default_context(cafile=cafile, cadata=pem)
    except (OSError, ValueError) as err:  # ssl.SSLError is an OSError
        where = cafile or TORCHYARD_REGISTRY_CA
        raise RegistryError(
            f"cannot load the registry's CA certificate from {where}: {err}; pass the PEM "
            "file of the CA that signed the registry's certificate (--registry-ca)"
        ) from None


def _entries(manifest: Any, dest: Path | None) -> list[tuple[str, str, Path | None]]:
    """(path, sha256, where it goes under ``dest``) of each file of a manifest, all checked
    before any is downloaded: a manifest comes over the network, its paths are not trusted."""
    try:
        version, files = manifest["version"], manifest["files"]
    except (KeyError, TypeError):
        raise RegistryError("the registry sent a manifest without version and files") from None
    if not isinstance(version, int) or not isinstance(files, list):
        raise RegistryError("the registry sent a malformed manifest (version, files)")
    top = dest.resolve() if dest is not None else None
    checked: list[tuple[str, str, Path | None]] = []
    for entry in files:
        path = entry.get("path") if isinstance(entry, dict) else None
        sha256 = entry.get("sha256") if isinstance(entry, dict) else None
        if not isinstance(sha256, str) or not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise RegistryError(f"the manifest's entry {entry!r} has no sha256: not downloading")
        unsafe = (
            not isinstance(path, str)
            or not path
            or path.startswith("/")
            or any(c == "\\" or ord(c) < 32 for c in path)
            or any(part in ("", ".", "..") for part in path.split("/"))
        )
        target = None
        if not unsafe and dest is not None and top is not None:
            target = dest / str(path)
            unsafe = not target.resolve().is_relative_to(top)
        if unsafe:
            raise RegistryError(
                f"the manifest names the file {path!r}, which would land outside the "
                f"download folder: refusing the whole download (nothing was written); "
                "the registry's copy of this version is damaged or tampered with"
            )
        checked.append((str(path), sha256, target))
    return checked


def _receive(
    resp: Any,
    digest: Any,
    fd: int,
    progress: Callable[[int], None] | None = None,
    size: int | None = None,
) -> int:
    """Read the body into a ring of small buffers while one thread hashes each buffer
    read and then writes it (to ``fd``, unless it is -1): the socket read, hashlib and
    os.write all release the GIL, so reading overlaps hashing and writing on two cores.
    A buffer (256 KiB) stays in the CPU's cache from the read through the hash to the
    write: 4 MiB ones went to memory at every step, and cost a third more CPU per GiB
    (``benchmarks/registry_throughput.py``). Hashing and writing keep the body's order;
    a buffer is refilled only once both are done.

    A body whose announced ``size`` fits one buffer is read, hashed and written in this
    thread. Returns the bytes read."""
    if size is not None and size <= BUFFER:
        buf = memoryview(bytearray(size))
        n = _fill(resp, buf)
        _hash_and_write(digest, fd, buf[:n])
        if progress:
            progress(n)
        return n
    ring = _Ring(digest, fd)
    total = unreported = 0
    try:
        for buf in itertools.cycle([memoryview(bytearray(BUFFER)) for _ in range(RING)]):
            ring.wait_for_free()
            n = _fill(resp, buf)
            if not n:
                break
            ring.hand_over(buf[:n])
            total += n
            unreported += n
            if progress and unreported >= REPORT_EVERY:
                progress(unreported)
                unreported = 0
    finally:
        ring.finish()
    if progress and unreported:
        progress(unreported)
    return total


def _hash_and_write(digest: Any, fd: int, data: memoryview) -> None:
    digest.update(data)
    if fd >= 0:
        _write_all(fd, data)


class _Ring:
    """The thread of one download that hashes and writes the buffers handed over, in
    order; ``RING`` buffers at most are in its hands at once. An error there (a full
    disk) is raised to the reader at its next buffer, or at the end."""

    def __init__(self, digest: Any, fd: int) -> None:
        self.digest, self.fd = digest, fd
        self.todo: queue.SimpleQueue[memoryview | None] = queue.SimpleQueue()
        self.done: queue.SimpleQueue[None] = queue.SimpleQueue()
        self.in_flight = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (data := self.todo.get()) is not None:
            if self.error is None:
                try:
                    _hash_and_write(self.digest, self.fd, data)
                except BaseException as err:  # raised to the reader
                    self.error = err
            self.done.put(None)

    def wait_for_free(self) -> None:
        """Wait until the buffer about to be refilled (the oldest) is hashed and written."""
        if self.in_flight == RING:
            self.done.get()
            self.in_flight -= 1
        if self.error is not None:
            raise self.error

    def hand_over(self, data: memoryview) -> None:
        self.todo.put(data)
        self.in_flight += 1

    def finish(self) -> None:
        """Wait until every buffer handed over is hashed and written; raise its error."""
        self.todo.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data) :]


def _fill(resp: Any, buf: memoryview) -> int:
    """Read until ``buf`` is full or the body ends; the number of bytes read."""
    got = 0
    while got < len(buf):
        n = resp.readinto(buf[got:])
        if not n:
            break
        got += n
    return got


class _Reader:
    """A file for urllib to send, reporting progress."""

    def __init__(self, f: Any, progress: Progress | None) -> None:
        self.f = f
        self.progress = progress

    def read(self, n: int = -1) -> bytes:
        block: bytes = self.f.read(n if n and n > 0 else CHUNK)
        if self.progress and block:
            self.progress.update(len(block))
        return block
