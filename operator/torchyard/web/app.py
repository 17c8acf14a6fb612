"""The web view as an aiohttp application: its routes (``views``), the assets shipped in
this package (``static/``: nothing from a CDN), and the one place that turns what went
wrong into an answer: a :class:`~torchyard.web.queries.Refusal` or the apiserver's own
refusal (403, 404 ...) into a page (or JSON under ``/api/``) with its status and message,
an unreachable cluster into 502; never a traceback.

Every answer carries a strict Content-Security-Policy (scripts and styles of this origin
only; set as it is sent, :func:`secured`), and a request for any other Host than the one
served is refused (a page of another site cannot reach it by DNS rebinding).
:func:`serve` runs it on 127.0.0.1 for ``torchyard ui``. Tested in tests/unit/web/ and
tests/integration/web/.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Awaitable, Callable, Collection
from importlib import resources

from aiohttp import web

from torchyard import k8s
from torchyard.web import access, html, views
from torchyard.web.queries import DNS_LABEL, Refusal
from torchyard.web.source import RunSource

log = logging.getLogger(__name__)
STATIC_TYPES = {
    "app.css": "text/css",
    "app.js": "text/javascript",
    "charts.js": "text/javascript",
    "uplot.iife.min.js": "text/javascript",
    "uplot.min.css": "text/css",
    "favicon.svg": "image/svg+xml",
}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
HOSTS = web.AppKey("hosts", set[str])


def make_app(
    source: RunSource,
    *,
    namespace: str,
    hosts: Collection[str] = (),
    reviews: access.Reviews | None = None,
) -> web.Application:
    """The application over ``source``; ``namespace`` is the one ``/`` opens; ``hosts``
    (``127.0.0.1:8080`` ...) the Host headers it answers (empty: any). With ``reviews``
    (in the cluster) every caller brings a token and reads through an
    :class:`~torchyard.web.access.AuthorizedSource` of its own."""
    app = web.Application(middlewares=[guard], client_max_size=64 << 10)
    app[HOSTS] = set(hosts)
    if reviews is not None:
        app[views.REVIEWS] = reviews
    app[views.SOURCE] = source
    app[views.TOKEN] = secrets.token_urlsafe(32)
    app[views.NAMESPACE] = namespace
    app.add_routes(views.routes())
    app.router.add_get("/static/{file}", static)
    app.on_response_prepare.append(secured)
    return app


async def secured(request: web.Request, response: web.StreamResponse) -> None:
    """The security headers of every response, set as it is sent (a streamed download's
    too, whose headers go before its handler returns)."""
    for key, value in HEADERS.items():
        response.headers.setdefault(key, value)


def asset(name: str) -> bytes:
    return resources.files("torchyard.web").joinpath("static").joinpath(name).read_bytes()


async def static(request: web.Request) -> web.Response:
    name = request.match_info["file"]
    if name not in STATIC_TYPES:  # a fixed list: nothing else of the disk is reachable
        raise Refusal(f"no asset {name[:80]!r}", 404)
    response = web.Response(body=asset(name), content_type=STATIC_TYPES[name])
    response.headers["Cache-Control"] = "max-age=3600"
    return response


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The Host check and the error answers (the security headers: :func:`secured`)."""
    hosts = request.app[HOSTS]
    try:
        if hosts and request.host not in hosts:
            raise Refusal(f"this server answers for {', '.join(sorted(hosts))} only", 421)
        if views.REVIEWS in request.app and not _open(request.path):
            await views.caller(request)  # (the caller's token, reviewed; else to /login)
        response = await handler(request)
    except Refusal as err:
        response = _error(request, err.status, err.message)
    except k8s.ApiError as err:  # the apiserver's answer to the caller: shown as it is
        response = _error(request, err.status if 400 <= err.status < 600 else 502, err.message)
    except k8s.Unreachable as err:
        response = _error(request, 502, f"the cluster did not answer: {err}")
    except web.HTTPRedirection:
        raise
    except web.HTTPException as err:  # aiohttp's own: no route (404), wrong method (405)
        said = {404: "no page at this address", 405: f"{request.method} is not allowed here"}
        response = _error(request, err.status, said.get(err.status, err.reason))
    return response


def _open(path: str) -> bool:
    """What needs no token: the login page and the assets."""
    return path in ("/login", "/logout") or path.startswith("/static/")


def _error(request: web.Request, status: int, message: str) -> web.Response:
    if request.path.startswith("/api/") or request.path.startswith("/static/"):
        return web.Response(
            status=status, text=json.dumps({"error": message}), content_type="application/json"
        )
    ns = request.match_info.get("ns", "")
    shown = ns if DNS_LABEL.fullmatch(ns) else request.app[views.NAMESPACE]
    text = html.error_page(status, message, namespace=shown, token=request.app[views.TOKEN])
    return web.Response(status=status, text=text, content_type="text/html")


def serve(app: web.Application, host: str, port: int, on_ready: Callable[[str], None]) -> None:
    """Serve ``app`` until interrupted; ``on_ready(url)`` once it listens (``port`` 0: a
    free one)."""
    import asyncio

    async def main() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1]
        app[HOSTS].update({f"{host}:{bound}", f"localhost:{bound}"})
        on_ready(f"http://{host}:{bound}/")
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())
