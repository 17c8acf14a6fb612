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
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

AUDIENCE = "torchyard-registry"
CHUNK = 1 << 20


class RegistryError(Exception):
    """The registry said no, or is not there; the message says which."""


class RegistryClient:
    def __init__(self, url: str | None = None, token: str | None = None) -> None:
        url = url or os.environ.get("TORCHYARD_REGISTRY_URL")
        if not url:
            raise RegistryError(
                "no registry service: pass --registry-url or set TORCHYARD_REGISTRY_URL"
            )
        self.url = url.rstrip("/")
        self.token = token or os.environ.get("TORCHYARD_TOKEN", "")

    @classmethod
    def for_service_account(cls, url: str | None, namespace: str, name: str) -> RegistryClient:
        from torchyard import k8s

        try:
            token = k8s.request_token(namespace, name, [AUDIENCE])
        except k8s.ApiError as err:
            raise RegistryError(
                f"cannot get a token for {namespace}/{name}: {err.message}"
            ) from None
        return cls(url, token)

    # -- transport --------------------------------------------------------------------

    def _open(self, path: str) -> Any:
        req = urllib.request.Request(self.url + urllib.parse.quote(path))
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            return urllib.request.urlopen(req, timeout=300)
        except urllib.error.HTTPError as err:
            detail = err.read()[:300].decode("utf-8", "replace")
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
        try:
            with self._open(path) as resp:
                out = tmp.open("wb") if tmp else None
                try:
                    for chunk in iter(lambda: resp.read(CHUNK), b""):
                        digest.update(chunk)
                        if out:
                            out.write(chunk)
                finally:
                    if out:
                        out.close()
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

    # -- runs -------------------------------------------------------------------------

    def download_run_file(self, namespace: str, run: str, path: str, dest: Path) -> Path:
        """A run's archived file (``outputs/...`` or ``logs/node-N/...``), ~ run.download_file."""
        if not path.startswith(("outputs/", "logs/")):
            raise RegistryError("the path starts with outputs/ or logs/")
        self._stream(f"/v1/namespaces/{namespace}/runs/{run}/{path}", dest, None)
        return dest
