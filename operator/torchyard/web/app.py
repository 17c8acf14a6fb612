"""The web view as an aiohttp application: its routes (``views``), the assets shipped in
this package (``static/``: nothing from a CDN), and the one place that turns what went
wrong into an answer: a :class:`~torchyard.web.queries.Refusal` or the apiserver's own
refusal (403, 404 ...) into a page (or JSON under ``/api/``) with its status and message,
an unreachable cluster into 502; never a traceback.

Every answer carries a strict Content-Security-Policy (scripts and styles of this origin
only; set as it is sent, :func:`secured`), aiohttp's own answer to a request it cannot
read too (:class:`Runner`). Before a route runs, :func:`guard` believes a trusted proxy's
forwarded scheme and host, refuses a Host it does not answer for (``front``) and a change
that is not from its own origin with its browser's token (``csrf``). :func:`serve` runs
it for ``torchyard ui``, over TLS when given a certificate. Tested in tests/unit/web/ and
tests/integration/web/.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Awaitable, Callable, Collection
from http import HTTPStatus
from importlib import resources

from aiohttp import web, web_protocol, web_request

from torchyard import k8s
from torchyard.web import access, csrf, front, html, views
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
    # (same-origin, not no-referrer: under no-referrer a browser sends `Origin: null`
    # with the view's own forms, and csrf refuses null)
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
HEALTH = "/healthz"


def make_app(
    source: RunSource,
    *,
    namespace: str,
    hosts: Collection[str] = (),
    reviews: access.Reviews | None = None,
    key: bytes | None = None,
    proxies: Collection[front.Network] = (),
) -> web.Application:
    """The application over ``source``; ``namespace`` is the one ``/`` opens; ``hosts``
    the Host names it answers for (empty: any; :func:`serve` adds the loopback names);
    ``key`` signs the pages' tokens (the same on every replica; default: a new one);
    ``proxies`` the networks whose forwarded scheme and host it believes. With
    ``reviews`` (in the cluster) every caller brings a token and reads through an
    :class:`~torchyard.web.access.AuthorizedSource` of its own."""
    app = web.Application(middlewares=[guard], client_max_size=64 << 10)
    app[front.HOSTS] = {front.allowed_name(h) for h in hosts}
    app[front.PROXIES] = tuple(proxies)
    app[csrf.KEY] = key if key is not None else csrf.new_key()
    if reviews is not None:
        app[views.REVIEWS] = reviews
    app[views.SOURCE] = source
    app[views.NAMESPACE] = namespace
    app.add_routes(views.routes())
    app.router.add_get("/static/{file}", static)
    app.router.add_get(HEALTH, healthz)
    app.on_response_prepare.append(secured)
    return app


async def secured(request: web.Request, response: web.StreamResponse) -> None:
    """The security headers of every response, set as it is sent (a streamed download's
    too, whose headers go before its handler returns)."""
    for key, value in HEADERS.items():
        response.headers.setdefault(key, value)


def asset(name: str) -> bytes:
    return resources.files("torchyard.web").joinpath("static").joinpath(name).read_bytes()


async def healthz(request: web.Request) -> web.Response:
    """The kubelet's probe: answers any Host (it says the Pod's IP), needs no token."""
    return web.Response(text="ok")


async def static(request: web.Request) -> web.Response:
    name = request.match_info["file"]
    if name not in STATIC_TYPES:  # a fixed list: nothing else of the disk is reachable
        raise Refusal(f"no asset {name[:80]!r}", 404)
    response = web.Response(body=asset(name), content_type=STATIC_TYPES[name])
    response.headers["Cache-Control"] = "max-age=3600"
    return response


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Where the request came from (``front``), whether it may change anything
    (``csrf``), who asks (in the cluster), and the error answers (the security headers:
    :func:`secured`)."""
    request = front.seen(request)
    try:
        if not (front.allowed(request) or request.path == HEALTH):
            names: set[str] = request.app[front.HOSTS]
            raise Refusal(f"this server answers for {', '.join(sorted(names))} only", 421)
        await csrf.check(request)
        if views.REVIEWS in request.app and not _open(request.path):
            await views.caller(request)  # (the caller's token, reviewed; else to /login)
        response = await handler(request)
    except Refusal as err:
        response = _error(request, err.status, err.message)
    except k8s.ApiError as err:  # the apiserver's answer to the caller: shown as it is
        response = _error(request, err.status if 400 <= err.status < 600 else 502, err.message)
    except k8s.Unreachable as err:
        response = _error(request, 502, f"the cluster did not answer: {err}")
    except web.HTTPRedirection as redirect:
        csrf.remember(request, redirect)
        raise
    except web.HTTPException as err:  # aiohttp's own: no route (404), wrong method (405)
        said = {404: "no page at this address", 405: f"{request.method} is not allowed here"}
        response = _error(request, err.status, said.get(err.status, err.reason))
    csrf.remember(request, response)
    return response


def _open(path: str) -> bool:
    """What needs no signed-in token: the login page, the probe and the assets."""
    return path in ("/login", "/logout", HEALTH) or path.startswith("/static/")


def _error(request: web.Request, status: int, message: str) -> web.Response:
    if request.path.startswith("/api/") or request.path.startswith("/static/"):
        return web.Response(
            status=status, text=json.dumps({"error": message}), content_type="application/json"
        )
    ns = request.match_info.get("ns", "")
    shown = ns if DNS_LABEL.fullmatch(ns) else request.app[views.NAMESPACE]
    text = html.error_page(status, message, namespace=shown, token=csrf.token(request))
    return web.Response(status=status, text=text, content_type="text/html")


class Runner(web.AppRunner):
    """aiohttp's runner, whose connections answer what aiohttp itself cannot read (an
    overlong request line: 400) with the view's security headers and a fixed text:
    aiohttp's own answer would echo the request line back."""

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()
        # (aiohttp offers no hook for its protocol errors: the handler class is the seam;
        # tests/unit/web/test_serve.py fails if a new aiohttp moves it)
        return _Server(
            made.request_handler,
            request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation,
            loop=asyncio.get_running_loop(),
            **made._kwargs,
        )


class _Server(web.Server):
    def __call__(self) -> web_protocol.RequestHandler:
        return _Handler(self, loop=self._loop, **self._kwargs)


class _Handler(web_protocol.RequestHandler):
    def handle_error(
        self,
        request: web_request.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        super().handle_error(request, status, exc, None)  # (logs it; raises when too late)
        text = f"{status} {HTTPStatus(status).phrase}: the server could not serve this request"
        response = web.Response(status=status, text=text, headers=HEADERS)
        response.force_close()
        return response


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    """A server TLS context of ``cert`` and ``key`` (PEM files): TLS 1.2 or newer."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


async def start(
    app: web.Application, host: str, port: int, tls: ssl.SSLContext | None = None
) -> tuple[Runner, str]:
    """``app`` listening on ``host``:``port`` (0: a free one), over TLS when given
    ``tls``: its runner (``cleanup()`` stops it) and its URL. Besides its Host names it
    answers for the loopback names and ``host``."""
    app[front.HOSTS].update(front.listening_names(host))
    runner = Runner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=tls).start()
    bound = runner.addresses[0][1]
    shown = f"[{host}]" if ":" in host else host
    return runner, f"{'https' if tls else 'http'}://{shown}:{bound}"


def serve(
    app: web.Application,
    host: str,
    port: int,
    on_ready: Callable[[str], None],
    tls: ssl.SSLContext | None = None,
) -> None:
    """Serve ``app`` (:func:`start`) until interrupted; ``on_ready(url)`` once it listens."""

    async def main() -> None:
        runner, url = await start(app, host, port, tls)
        on_ready(f"{url}/")
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())
