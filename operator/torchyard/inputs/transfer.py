"""One file over HTTP(S) into the staging folder, resumed where a killed fetch stopped.

:func:`download` asks for ``Range: bytes=<size of the .part file>-`` when a part is
there: a 206 answer is appended, a 200 (a server without ranges) starts again from the
first byte. The byte limit is checked against Content-Length before the body is read and
again while it streams. HTTP errors become an :class:`~torchyard.inputs.uris.InputError`
that names the URL, the status and the fix. Standard library only; used by the web and
model schemes, tested against a local server in tests/unit/inputs/test_fetch.py.
"""

from __future__ import annotations

import http.client
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from torchyard.inputs.base import InputError

TIMEOUT_SECONDS = 60
BLOCK = 1 << 20

_ADVICE = {
    401: "the server wants credentials; an input must be readable without them",
    403: "the server refuses the request; an input must be readable without credentials",
    404: "nothing is there: check the URL",
    410: "the file is gone from the server: check the URL",
}


def advice(status: int) -> str:
    if status in _ADVICE:
        return _ADVICE[status]
    if status >= 500:
        return "the server failed; submit the run again once it answers"
    return "check the URL"


def download(
    url: str,
    part: str,
    max_bytes: int,
    headers: Mapping[str, str] | None = None,
    context: ssl.SSLContext | None = None,
    shown: str = "",
) -> int:
    """Fetch ``url`` into ``part`` (going on from what it holds); the bytes received.
    ``shown``: how errors name the URL (the URI of the input)."""
    shown = shown or url
    have = os.path.getsize(part) if os.path.isfile(part) else 0
    request = urllib.request.Request(url, headers=dict(headers or {}))
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        resp = urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS, context=context)
    except urllib.error.HTTPError as err:
        if err.code == 416 and have:  # the part is longer than the file: start again
            os.unlink(part)
            return download(url, part, max_bytes, headers, context, shown)
        raise InputError(f"{shown}: HTTP {err.code} {err.reason}: {advice(err.code)}") from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise InputError(
            f"{shown}: cannot reach the server ({reason}): check the host name, and that "
            "the cluster's Pods may reach it"
        ) from None
    with resp:
        resuming = bool(have) and resp.status == 206
        length = resp.headers.get("Content-Length")
        start = have if resuming else 0
        if length is not None and length.isdigit() and start + int(length) > max_bytes:
            raise InputError(
                f"{shown} is {start + int(length)} bytes, over the inputs cache's limit of "
                f"{max_bytes} bytes: ask for a larger cache, or use a smaller file"
            )
        received = _stream(resp, part, resuming, start, max_bytes, shown)
    if length is not None and length.isdigit() and received < int(length):
        raise InputError(
            f"{shown}: the server closed the connection after {start + received} of "
            f"{start + int(length)} bytes; the next fetch goes on from there"
        )
    return received


def _stream(resp: Any, part: str, resuming: bool, start: int, max_bytes: int, shown: str) -> int:
    received = 0
    with open(part, "ab" if resuming else "wb") as out:
        try:
            for block in iter(lambda: resp.read(BLOCK), b""):
                received += len(block)
                if start + received > max_bytes:
                    raise InputError(
                        f"{shown} is over the inputs cache's limit of {max_bytes} bytes: "
                        "ask for a larger cache, or use a smaller file"
                    )
                out.write(block)
        except (http.client.HTTPException, OSError) as err:
            out.flush()
            raise InputError(
                f"{shown}: the download broke off after {start + received} bytes ({err!r}); "
                "the next fetch goes on from there"
            ) from None
    return received
