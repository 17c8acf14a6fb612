"""A Pod's log, streamed line by line from the kubelet through the apiserver
(:func:`pod_log_lines`). Used by ``torchyard logs``/``wait`` and the SDK's
``wait_for_completion(show_output=True)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import urllib3.exceptions
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from torchyard.k8s import connections, errors, rest
from torchyard.k8s.resources import PODS


def pod_log_lines(
    namespace: str,
    pod: str,
    *,
    container: str | None = None,
    follow: bool = False,
    tail_lines: int | None = None,
    limit_bytes: int | None = None,
    timeout: float = 60,
    api: ApiClient | None = None,
    previous: bool = False,
) -> Iterator[str]:
    """A Pod's log, line by line (``follow``: until the container ends; ``tail_lines``: its
    last lines only; ``limit_bytes``: at most that much of them; ``previous``: the
    container's run before its last restart, e.g. a serving process whose init()
    raised). The apiserver gets it from the node's kubelet; errors surface as
    :class:`ApiError`, or :class:`Unreachable` when the apiserver does not answer
    (within ``timeout`` seconds, unless following) or the stream breaks off. ``api``:
    whose credentials (default: the shared client)."""
    api = api or connections.load()
    query: list[tuple[str, Any]] = []
    if container:
        query.append(("container", container))
    if follow:
        query.append(("follow", "true"))
    if tail_lines is not None:
        query.append(("tailLines", tail_lines))
    if limit_bytes is not None:
        query.append(("limitBytes", limit_bytes))
    if previous:
        query.append(("previous", "true"))
    rest.REQUESTS["GET"] += 1
    try:
        method, url, headers, _, _ = api.param_serialize(
            method="GET",
            resource_path=PODS.path(namespace, pod, "log"),
            query_params=query,
            header_params={"Accept": "*/*"},
            auth_settings=["BearerToken"],
        )
        response = api.call_api(
            method, url, header_params=headers, _request_timeout=None if follow else timeout
        )
    except ApiException as exc:
        raise errors.from_exception(exc) from None
    except urllib3.exceptions.HTTPError as err:  # refused, timed out
        raise errors.unreachable(err) from None
    if not 200 <= response.status < 300:
        raise errors.from_response(response.status, response.reason, response.read())
    pending = b""
    try:
        for chunk in response.response.stream(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.decode("utf-8", "replace")
        if pending:
            yield pending.decode("utf-8", "replace")
    except urllib3.exceptions.HTTPError as err:  # the stream broke off
        raise errors.unreachable(err) from None
    finally:
        response.response.release_conn()


__all__ = ["pod_log_lines"]
