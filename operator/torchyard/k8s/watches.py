"""Watching a kind of object outside Kopf: a list with its resourceVersion, then a watch
stream from it, read on the caller's thread.

:func:`list_versioned` lists (the items and the list's ``resourceVersion``);
:class:`WatchStream` opens ``?watch=1`` from that version and yields, per read off the
socket, the list of ``(type, object)`` events it held, until the server ends the stream
(``timeoutSeconds``) or :meth:`WatchStream.close` is called from another thread (the
socket is shut, the reading thread sees the end). An ``ERROR`` event raises
:class:`~torchyard.k8s.errors.ApiError` (410 ``Gone``: the version is too old, list
again). Bookmarks move the version on and yield nothing.

Called by ``controller.pod_watch`` (the operator's own Pod watch, which feeds the
admission cache and a run's status without Kopf's per-object queues) through the package
(``k8s.WatchStream``); tested against a real apiserver in
tests/integration/test_pod_watch.py.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import urllib3.exceptions
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from torchyard.k8s import connections, errors, rest
from torchyard.k8s.resources import Resource


def list_versioned(
    res: Resource,
    namespace: str | None = None,
    *,
    api: ApiClient | None = None,
    label_selector: str | None = None,
    field_selector: str | None = None,
) -> tuple[list[dict[str, Any]], str]:
    """The items and the list's ``resourceVersion`` (where a watch starts from)."""
    query: list[tuple[str, Any]] = []
    if label_selector:
        query.append(("labelSelector", label_selector))
    if field_selector:
        query.append(("fieldSelector", field_selector))
    data = rest.call("GET", res.path(namespace), query=query, api=api)
    items: list[dict[str, Any]] = data.get("items", [])
    return items, str((data.get("metadata") or {}).get("resourceVersion") or "")


class WatchStream:
    """One watch request: iterate it for lists of ``(type, object)`` (one list per read,
    so that a burst is handed on at once); :attr:`version` is the
    ``resourceVersion`` of the last event (or bookmark) read."""

    def __init__(
        self,
        res: Resource,
        namespace: str | None,
        version: str,
        *,
        timeout_seconds: int = 300,
        label_selector: str | None = None,
        api: ApiClient | None = None,
    ) -> None:
        self.res, self.namespace, self.version = res, namespace, version
        self.timeout_seconds = timeout_seconds
        self.label_selector = label_selector
        self.api = api  # whose credentials (None: the shared client)
        self._response: Any = None
        self._closed = threading.Event()

    def __iter__(self) -> Iterator[list[tuple[str, dict[str, Any]]]]:
        query: list[tuple[str, Any]] = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", self.version),
            ("timeoutSeconds", self.timeout_seconds),
        ]
        if self.label_selector:
            query.append(("labelSelector", self.label_selector))
        api = self.api or connections.load()
        rest.REQUESTS["WATCH"] += 1
        try:
            method, url, headers, _, _ = api.param_serialize(
                method="GET",
                resource_path=self.res.path(self.namespace),
                query_params=query,
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
            response = api.call_api(
                method,
                url,
                header_params=headers,
                # (connect, read): a read waits at most a little past the server's timeout
                _request_timeout=(30, self.timeout_seconds + 30),
            )
        except ApiException as exc:
            raise errors.from_exception(exc) from None
        except urllib3.exceptions.HTTPError as err:
            raise errors.unreachable(err) from None
        raw = response.response  # urllib3's, not preloaded: read as it comes
        if not 200 <= response.status < 300:
            raise errors.from_response(response.status, response.reason, raw.data)
        self._response = raw
        if self._closed.is_set():
            self._shut()
        try:
            yield from self._events(raw)
        except (urllib3.exceptions.HTTPError, OSError, ValueError):
            if not self._closed.is_set():
                raise errors.unreachable(
                    urllib3.exceptions.ProtocolError("the watch stream broke")
                ) from None
        finally:
            raw.release_conn()

    def _events(self, raw: Any) -> Iterator[list[tuple[str, dict[str, Any]]]]:
        pending = b""
        while not self._closed.is_set():
            chunk = raw.read1(65536)  # what has come, at most this much: waits for some
            if not chunk:
                return  # the server ended the stream
            pending += chunk
            *lines, pending = pending.split(b"\n")
            batch: list[tuple[str, dict[str, Any]]] = []
            for line in lines:
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = str(event.get("type")), event.get("object") or {}
                if kind == "ERROR":
                    code = int(obj.get("code") or 500)
                    body = json.dumps(obj).encode()
                    raise errors.from_response(code, str(obj.get("reason")), body)
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if version:
                    self.version = str(version)
                if kind != "BOOKMARK":
                    batch.append((kind, obj))
            if batch and not self._closed.is_set():
                yield batch

    def close(self) -> None:
        """End the stream from another thread: the reader's iteration stops."""
        self._closed.set()
        self._shut()

    def _shut(self) -> None:
        raw = self._response
        if raw is None:
            return
        # urllib3's connection of the response (while it is being read), else the socket
        # under http.client's reader
        sock = getattr(getattr(raw, "connection", None), "sock", None)
        if not isinstance(sock, socket.socket):
            reader = getattr(getattr(raw, "_fp", None), "fp", None)
            sock = getattr(getattr(reader, "raw", None), "_sock", None)
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


__all__ = ["WatchStream", "list_versioned"]
