"""The HTTP client of the registry service: the one way torchyard talks to it.

:class:`RegistryClient` holds the transport (URL, token, TLS, extra headers), the reads
every user needs (models, a version's manifest, a run's archived files) and
:meth:`RegistryClient.promote`, the one promotion of a run's archive to a model version.
The operator's finalize step (``controller.finalize``) uses it as it is; the SDK's
``torchyard.sdk.registry.RegistryClient`` extends it with downloads, source snapshots and
tokens minted through Kubernetes; it is also the cluster's ``torchyard.records.Records``
(:meth:`RegistryClient.list_records`, :meth:`RegistryClient.get_record`, written by the
operator with :meth:`RegistryClient.put_record`); local mode has no service and publishes into its
:class:`~torchyard.registry.store.Store` with the same metadata
(``planning.models.promote_metadata``). Standard library only; tested in
tests/unit/registry/test_client.py and, against the real service, in
tests/integration/test_registry_service.py.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from torchyard.records.reader import Page, Query, Records
from torchyard.records.schema import KINDS, Record, Summary

# The registry's token header when the request goes through the apiserver's service
# proxy: the apiserver authenticates the caller and drops ``Authorization`` before
# forwarding, so the registry token travels beside it.
TOKEN_HEADER = "X-Torchyard-Token"


class RegistryError(Exception):
    """The registry said no, or is not there; the message says which. ``status`` is the
    HTTP status of a refusal, None when the service was not reached."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RegistryClient(Records):
    """Talks to the service at ``url`` with ``token`` (sent as ``Authorization: Bearer``,
    or bare in ``token_header``), verifying an https service with ``ssl_context``."""

    def __init__(
        self,
        url: str,
        token: str = "",
        *,
        ssl_context: ssl.SSLContext | None = None,
        headers: Mapping[str, str] | None = None,
        token_header: str = "Authorization",
        timeout: float = 300,
    ) -> None:
        if not url:
            raise RegistryError("no registry service URL")
        self.url = url.rstrip("/")
        self.token = token
        self.ssl_context = ssl_context
        self.timeout = timeout
        self.headers = dict(headers or {})
        if self.token:
            bearer = token_header == "Authorization"
            self.headers[token_header] = f"Bearer {self.token}" if bearer else self.token

    # -- transport --------------------------------------------------------------------

    def _open(
        self,
        path: str,
        method: str = "GET",
        data: Any = None,
        headers: dict[str, str] | None = None,
        query: str = "",
    ) -> Any:
        req = urllib.request.Request(
            self.url + urllib.parse.quote(path) + (f"?{query}" if query else ""),
            data=data,
            method=method,
            headers={**self.headers, **(headers or {})},
        )
        try:
            return urllib.request.urlopen(req, timeout=self.timeout, context=self.ssl_context)
        except urllib.error.HTTPError as err:
            detail = (err.read() or b"")[:300].decode("utf-8", "replace")
            raise RegistryError(f"{err.code} {detail}".strip(), err.code) from None
        except (urllib.error.URLError, OSError) as err:
            raise RegistryError(
                f"the registry at {self.url} is not reachable: {getattr(err, 'reason', err)}"
            ) from None

    def _json(self, path: str, **request: Any) -> Any:
        with self._open(path, **request) as resp:
            raw = resp.read()
        try:
            return json.loads(raw)
        except ValueError:
            raise RegistryError(
                f"the registry at {self.url} answered {path} with something that is not JSON: "
                f"{raw[:100]!r}"
            ) from None

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

    def promote(
        self, namespace: str, model: str, run: str, path: str, metadata: Mapping[str, Any]
    ) -> dict[str, Any]:
        """A run's ``path`` (a file or folder of its archive) as the model's next version;
        promoting the same run (uid in metadata) again returns the version it made.
        ``metadata``: what ``planning.models.promote_metadata`` builds."""
        body = json.dumps({"run": run, "path": path, "metadata": dict(metadata)}).encode()
        manifest: dict[str, Any] = self._json(
            f"/v1/namespaces/{namespace}/models/{model}/versions",
            method="POST",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        return manifest

    # -- runs -------------------------------------------------------------------------

    def run_files(self, namespace: str, run: str) -> list[str]:
        """Every archived file of a run (``outputs/...``, ``logs/node-N/...``)."""
        files: list[str] = self._json(f"/v1/namespaces/{namespace}/runs/{run}")["files"]
        return files

    def run_entries(
        self, namespace: str, run: str, uid: str | None = None
    ) -> list[tuple[str, int | None]]:
        """Every archived file of a run with its size in bytes (None from a service that
        lists no sizes); ``uid``: of that run's archive (:meth:`run_archive`)."""
        return self.run_archive(namespace, run, uid)[0]

    def run_archive(
        self, namespace: str, run: str, uid: str | None = None
    ) -> tuple[list[tuple[str, int | None]], str]:
        """A run's archived files with their sizes, and the uid of the run they are of ('' when
        the registry recorded none). ``uid``: the archive of that run, even when a later
        run of the name took ``runs/<run>`` (the registry moved it aside); RegistryError
        (404) when the registry holds none of that uid."""
        data = self._json(f"/v1/namespaces/{namespace}/runs/{run}", query=_uid_query(uid))
        owner = str(data.get("owner") or "")
        if isinstance(data.get("entries"), list):
            return [(str(f["path"]), int(f["size"])) for f in data["entries"]], owner
        return [(str(f), None) for f in data["files"]], owner

    def read_run_file(self, namespace: str, run: str, path: str, uid: str | None = None) -> str:
        with self.open_run_file(namespace, run, path, uid) as resp:
            return str(resp.read().decode("utf-8", "replace"))

    def open_run_file(self, namespace: str, run: str, path: str, uid: str | None = None) -> Any:
        """The registry's answer for an archived file (``uid``: of that run's archive), to
        read (``read(n)``) and close: its ``Content-Length`` header is the file's size."""
        return self._open(f"/v1/namespaces/{namespace}/runs/{run}/{path}", query=_uid_query(uid))

    # -- records (``torchyard.records.Records`` over HTTP) --------------------------------

    def _records(self, namespace: str, kind: str) -> str:
        if kind not in KINDS:
            raise RegistryError(f"no records of kind {kind!r}: {', '.join(KINDS)}")
        return f"/v1/namespaces/{namespace}/records/{KINDS[kind]}"

    def put_record(self, record: Record) -> None:
        """Write ``record`` (the operator's; needs ``create`` on runrecords)."""
        path = f"{self._records(record['namespace'], record['kind'])}/{record['name']}"
        self._json(
            f"{path}/{record['uid']}",
            method="PUT",
            data=json.dumps(record).encode(),
            headers={"Content-Type": "application/json"},
        )

    def page(self, namespace: str, query: Query) -> Page:
        data = self._json(
            self._records(namespace, query.kind), query=urllib.parse.urlencode(query.params())
        )
        items: list[Summary] = data.get("items") or []
        return Page(items, data.get("continue"))

    def get_record(
        self, namespace: str, name: str, uid: str | None = None, *, kind: str = "TrainingRun"
    ) -> Record | None:
        path = f"{self._records(namespace, kind)}/{name}" + (f"/{uid}" if uid else "")
        try:
            found: Record = self._json(path)
        except RegistryError as err:
            if err.status == 404:
                return None
            raise
        return found

    def metrics_lines(
        self, namespace: str, name: str, uid: str, *, kind: str = "TrainingRun"
    ) -> list[str]:
        path = f"{self._records(namespace, kind)}/{name}/{uid}/metrics"
        try:
            with self._open(path) as resp:
                return str(resp.read().decode("utf-8", "replace")).splitlines()
        except RegistryError as err:
            if err.status == 404:
                return []
            raise


def _uid_query(uid: str | None) -> str:
    return "" if uid is None else urllib.parse.urlencode({"uid": uid})
