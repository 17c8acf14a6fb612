"""The web view's defence against cross-site request forgery. ``torchyard.web.app.guard``
calls :func:`check` before every request that may change something (any method but
GET, HEAD and OPTIONS: the buttons, ``/login`` and ``/logout``), and
:func:`remember` on every answer; ``torchyard.web.views`` puts :func:`token` in the
pages' forms. Both checks must pass, as in Django's ``CsrfViewMiddleware``:

- **From the view's own origin.** ``Sec-Fetch-Site``, when the browser sends it, must be
  ``same-origin`` (a page of the same site on another port is ``same-site``: refused).
  ``Origin``, when sent, must be the view's own scheme, host and port (``null`` is
  refused); without it ``Referer`` must be; over TLS a request with neither is refused.
  A client that sends none of them over plain HTTP (a script) is no browser that another
  site could drive, and still needs the token.
- **A token bound to the browser and its session.** A browser gets a random id in an
  HttpOnly, SameSite=Strict cookie (:data:`COOKIE`) with its first page; a page's token
  is an HMAC-SHA256, under the server's key, of that id and of the session (the hash of
  the signed-in Kubernetes token's cookie, in the cluster). A token therefore works only
  with the cookies it was made for: not in another browser, not after signing in with
  another identity, not with an id planted by another port of the same host (whoever
  plants one cannot compute its HMAC). Signing in and out gives the browser a new id.
  The key is the same on every replica (the chart's Secret), so each replica accepts the
  pages of the others.

Tested in tests/unit/web/test_csrf.py, on the real control plane in
tests/integration/web/test_in_cluster.py and in Chromium in
tests/integration/web/test_csrf_in_browser.py.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import urllib.parse

from aiohttp import web

from torchyard.web import access
from torchyard.web.queries import Refusal

COOKIE = "torchyard-ui-csrf"
FIELD = "token"  # the forms' field
HEADER = "X-Torchyard-Token"  # or this header, for a script's POST
KEY = web.AppKey("csrf-key", bytes)
FRESH = web.RequestKey("csrf-fresh", str)  # a new browser id this answer gives
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
KEY_BYTES = 32  # the least a key may hold
DEFAULT_PORTS = {"http": 80, "https": 443}
_ID = re.compile(r"[A-Za-z0-9_-]{43}")  # secrets.token_urlsafe(32)
Origin = tuple[str, str, int]


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def token(request: web.Request) -> str:
    """The token of the request's browser and session, for the forms of its page."""
    return _mac(request.app[KEY], browser(request), session(request))


def browser(request: web.Request) -> str:
    """The browser's id as its next request will carry it: the one this answer gives,
    else the cookie's, else a new one."""
    if FRESH in request:
        return request[FRESH]
    sent = request.cookies.get(COOKIE, "")
    return sent if _ID.fullmatch(sent) else renew(request)


def renew(request: web.Request) -> str:
    """A new browser id, given with this answer (signing in and out)."""
    request[FRESH] = secrets.token_urlsafe(32)
    return request[FRESH]


def session(request: web.Request) -> str:
    """What a token is bound to besides the browser: the signed-in token's cookie."""
    return request.cookies.get(access.COOKIE, "")


def remember(request: web.Request, response: web.StreamResponse) -> None:
    """Give the browser the id its page's tokens were made with (when it is new)."""
    if FRESH in request and not response.prepared:
        response.set_cookie(
            COOKIE,
            request[FRESH],
            httponly=True,
            samesite="Strict",
            secure=request.secure,
            path="/",
        )


async def check(request: web.Request) -> None:
    """Refuse (403) a request that may change something unless it comes from the view's
    own origin with the token of its browser and session."""
    if request.method in SAFE_METHODS:
        return
    same_origin(request)
    sent = request.cookies.get(COOKIE, "")
    if not _ID.fullmatch(sent):
        raise Refusal("this browser has no token cookie of this view: open the page again", 403)
    form = await request.post()
    given = str(form.get(FIELD) or request.headers.get(HEADER) or "")
    expected = _mac(request.app[KEY], sent, session(request))
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise Refusal("missing or wrong page token: open the page again and use its button", 403)


def same_origin(request: web.Request) -> None:
    """Refuse (403) a request that a browser says came from another origin."""
    site = request.headers.getall("Sec-Fetch-Site", [])
    if site and site != ["same-origin"]:
        said = ", ".join(site)[:40]
        raise Refusal(f"a request from another site (Sec-Fetch-Site: {said}) changes nothing", 403)
    own = origin_of(request.scheme, request.host)
    if own is None:
        raise Refusal("no origin of this view in the request's Host header", 400)
    for header in ("Origin", "Referer"):
        values = request.headers.getall(header, [])
        if not values:
            continue
        if len(values) > 1 or values[0] == "null" or parse(values[0]) != own:
            shown = "".join(c if c.isprintable() else "?" for c in ", ".join(values))[:120]
            raise Refusal(f"a request from {shown!r} ({header}) changes nothing here", 403)
        return
    if request.secure:
        raise Refusal("a request over TLS with neither Origin nor Referer changes nothing", 403)


def parse(url: str) -> Origin | None:
    """The origin (scheme, host, port) of an ``Origin`` or ``Referer`` value."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return parts.scheme, parts.hostname, port or DEFAULT_PORTS[parts.scheme]


def origin_of(scheme: str, host: str) -> Origin | None:
    """The origin of a request to ``host`` (its Host header) over ``scheme``."""
    return parse(f"{scheme}://{host}")


def _mac(key: bytes, browser_id: str, session_cookie: str) -> str:
    bound = hashlib.sha256(session_cookie.encode()).hexdigest() if session_cookie else ""
    mac = hmac.new(key, f"torchyard-ui\0{browser_id}\0{bound}".encode(), hashlib.sha256)
    return base64.urlsafe_b64encode(mac.digest()).rstrip(b"=").decode()
