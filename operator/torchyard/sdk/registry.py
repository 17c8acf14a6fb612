"""A client of the model registry service: list, show, download (sha256-verified), verify.

Talks HTTP to the service (``TORCHYARD_REGISTRY_URL`` or an explicit URL) with a
Kubernetes bearer token: from a file, from ``TORCHYARD_TOKEN``, or a short-lived token of
a ServiceAccount the caller may impersonate through the TokenRequest API (RBAC:
``create`` on ``serviceaccounts/token``). Downloads stream in 1 MiB blocks and are
checked against the manifest's sha256 before they are renamed into place.
"""

from __future__ import annotations

import hashlib
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from torchyard.sdk.progress import Progress

AUDIENCE = "torchyard-registry"
CHUNK = 1 << 20


class RegistryError(Exception):
    """The registry said no, or is not there; the message says which."""


# The registry's token header when the request goes through the apiserver's service
# proxy: the apiserver authenticates the caller and drops ``Authorization`` before
# forwarding, so the registry token travels beside it.
TOKEN_HEADER = "X-Torchyard-Token"
# Where the Helm chart puts the registry service.
DEFAULT_SERVICE = "torchyard-system/torchyard-registry:8080"


class RegistryClient:
    """``url`` + ``token``: talk to the service directly (in the cluster, or a port you
    reach). :meth:`through_kubernetes`: through the apiserver's service proxy, as the
    kubeconfig's user."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        headers: dict[str, str] | None = None,
        token_header: str = "Authorization",
    ) -> None:
        url = url or os.environ.get("TORCHYARD_REGISTRY_URL")
        if not url:
            raise RegistryError(
                "no registry service: pass --registry-url or set TORCHYARD_REGISTRY_URL"
            )
        self.url = url.rstrip("/")
        self.token = token or os.environ.get("TORCHYARD_TOKEN", "")
        self.ssl_context = ssl_context
        self.progress = False  # progress bars on standard error for files over 1 MiB
        self.headers = dict(headers or {})
        if self.token:
            bearer = token_header == "Authorization"
            self.headers[token_header] = f"Bearer {self.token}" if bearer else self.token

    @classmethod
    def for_service_account(cls, url: str | None, namespace: str, name: str) -> RegistryClient:
        return cls(url, _service_account_token(namespace, name))

    @classmethod
    def through_kubernetes(
        cls,
        namespace: str,
        service_account: str | None = None,
        service: str = DEFAULT_SERVICE,
    ) -> RegistryClient:
        """Reach the service at ``service`` (``NS/NAME:PORT``) through the apiserver's
        service proxy. The registry token is the kubeconfig's own bearer token (its user
        needs ``get``/``create`` on ``modelversions``), or, with ``service_account`` or
        when the kubeconfig authenticates by client certificate, a 10-minute token of that
        ServiceAccount (``default`` in ``namespace`` unless named) from TokenRequest."""
        from torchyard import k8s

        svc_ns, _, rest = service.partition("/")
        name, _, port = rest.partition(":")
        if not (svc_ns and name and port.isdigit()):
            raise RegistryError(f"--registry-service {service!r}: expected NAMESPACE/NAME:PORT")
        try:
            conn = k8s.connection()
        except Exception as err:  # no kubeconfig, unreadable certificate, ...
            raise RegistryError(f"cannot reach the Kubernetes API: {err}") from None
        token = conn.bearer_token
        if service_account or not token:
            token = _service_account_token(namespace, service_account or "default")
        url = conn.host + k8s.proxy_url(svc_ns, name, int(port))
        return cls(
            url,
            token,
            ssl_context=conn.ssl_context,
            headers=conn.headers,
            token_header=TOKEN_HEADER,
        )

    # -- transport --------------------------------------------------------------------

    def _open(
        self,
        path: str,
        method: str = "GET",
        data: Any = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        req = urllib.request.Request(
            self.url + urllib.parse.quote(path),
            data=data,
            method=method,
            headers={**self.headers, **(headers or {})},
        )
        try:
            return urllib.request.urlopen(req, timeout=300, context=self.ssl_context)
        except urllib.error.HTTPError as err:
            detail = (err.read() or b"")[:300].decode("utf-8", "replace")
            raise RegistryError(f"{err.code} {detail}".strip()) from None
        except (urllib.error.URLError, OSError) as err:
            raise RegistryError(
                f"the registry at {self.url} is not reachable: {getattr(err, 'reason', err)}"
            ) from None

    def _json(self, path: str) -> Any:
        with self._open(path) as resp:
            return json.loads(resp.read())

    # -- models -----------------------------------------------------------------------

    def models(self, namespace: str) -> dict[str, list[int]]:
        data: dict[str, list[int]] = self._json(f"/v1/namespaces/{namespace}/models")["models"]
        return data

    def manifest(self, namespace: str, model: str, version: int | None = None) -> dict[str, Any]:
        if version is None:
            versions = self.models(namespace).get(model)
            if not versions:
                raise RegistryError(f"model {namespace}/{model} has no versions")
            version = versions[-1]
        data: dict[str, Any] = self._json(
            f"/v1/namespaces/{namespace}/models/{model}/versions/{version}"
        )
        return data

    def _stream(self, path: str, dest: Path | None, sha256: str | None) -> str:
        """Download ``path`` (to ``dest`` when given); returns the sha256, checked if known."""
        digest = hashlib.sha256()
        tmp = None
        if dest is not None:
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.part")
        buf = memoryview(bytearray(4 * CHUNK))  # large reads: fewer trips through Python
        try:
            with self._open(path) as resp:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if tmp else -1
                total = int(resp.headers.get("Content-Length") or 0)
                bar = (
                    Progress(f"downloading {path.rsplit('/', 1)[-1]}", total)
                    if self.progress and total > CHUNK
                    else None
                )
                try:
                    while n := _fill(resp, buf):
                        digest.update(buf[:n])  # releases the GIL
                        if fd >= 0:
                            os.write(fd, buf[:n])
                        if bar:
                            bar.update(n)
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
        """Every file of a version into ``dest``, each checked against its sha256."""
        manifest = self.manifest(namespace, model, version)
        base = f"/v1/namespaces/{namespace}/models/{model}/versions/{manifest['version']}/files/"
        for entry in manifest["files"]:
            self._stream(base + entry["path"], dest / entry["path"], entry["sha256"])
        return manifest

    def verify(
        self, namespace: str, model: str, version: int | None = None
    ) -> tuple[dict[str, Any], list[str]]:
        """(manifest, files whose content does not match it) without saving anything."""
        manifest = self.manifest(namespace, model, version)
        base = f"/v1/namespaces/{namespace}/models/{model}/versions/{manifest['version']}/files/"
        bad = []
        for entry in manifest["files"]:
            if self._stream(base + entry["path"], None, None) != entry["sha256"]:
                bad.append(entry["path"])
        return manifest, bad

    def promote(
        self, namespace: str, model: str, run: str, path: str, metadata: dict[str, Any]
    ) -> dict[str, Any]:
        """A run's ``path`` (a file or folder of its archive) as the model's next version;
        promoting the same run (uid in metadata) again returns the version it made."""
        body = json.dumps({"run": run, "path": path, "metadata": metadata}).encode()
        with self._open(
            f"/v1/namespaces/{namespace}/models/{model}/versions",
            method="POST",
            data=body,
            headers={"Content-Type": "application/json"},
        ) as resp:
            manifest: dict[str, Any] = json.loads(resp.read())
        return manifest

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

    def run_files(self, namespace: str, run: str) -> list[str]:
        """Every archived file of a run (``outputs/...``, ``logs/node-N/...``)."""
        files: list[str] = self._json(f"/v1/namespaces/{namespace}/runs/{run}")["files"]
        return files

    def read_run_file(self, namespace: str, run: str, path: str) -> str:
        with self._open(f"/v1/namespaces/{namespace}/runs/{run}/{path}") as resp:
            return str(resp.read().decode("utf-8", "replace"))

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
    from torchyard import k8s

    try:
        return k8s.request_token(namespace, name, [AUDIENCE])
    except k8s.ApiError as err:
        raise RegistryError(
            f"cannot get a token of ServiceAccount {namespace}/{name} (TokenRequest needs "
            f"create on serviceaccounts/token): {err.message}"
        ) from None


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
