"""What ``tests/node/test_chart_on_node.py`` does with the chart's web view on the real
node: a caller's requests (:class:`Visitor`, cookies kept as a browser keeps them), a
proxy terminating TLS in front of the view's Service as an Ingress would
(:class:`TlsProxy`, with another Host), and the checks made through each."""

from __future__ import annotations

import asyncio
import http.client
import http.cookies
import json
import re
import ssl
import threading
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from aiohttp import ClientSession, web

from tests.builders import TrainingRunBuilder
from tests.integration.web.browser import READS, account
from tests.unit.registry.test_tls_and_tokens import make_pki
from torchyard import k8s

PUBLIC = "ui.example.test"  # the Host the proxy is reached by (an Ingress's host)
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}

FROM_A_POD = """\
import json, sys, urllib.error, urllib.request
base = sys.argv[1]
def get(path, headers):
    request = urllib.request.Request(base + path, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return [r.status, r.headers.get("Set-Cookie") or r.read().decode()]
    except urllib.error.HTTPError as err:
        return [err.code, err.headers.get("Set-Cookie") or ""]
print(json.dumps({
    "healthz": get("/healthz", {}),
    "login": get("/login", {"X-Forwarded-Proto": "https"}),
    "other host": get("/login", {"Host": "evil.test"}),
}))
"""


def from_a_pod(run: Callable[[list[str]], str], service: str) -> dict[str, list[Any]]:
    """What a Pod gets from the view's Service by its DNS name (``run(command)``: the
    Pod's log)."""
    log = run(["python3", "-c", FROM_A_POD, f"http://{service}:8080"])
    seen: dict[str, list[Any]] = json.loads(log.strip().splitlines()[-1])
    return seen


def idle_run(namespace: str) -> str:
    """A TrainingRun that waits for an Environment that is not there: never finishes."""
    k8s.create(TrainingRunBuilder("idle", namespace).environment("not-there").obj())
    return "idle"


def editor_token(namespace: str) -> str:
    """A token of a ServiceAccount that may read the namespace's runs and suspend them."""
    account(namespace, "ui-editor", [*READS, "patch"])
    return k8s.request_token(namespace, "ui-editor", [], seconds=3600)


def suspended(namespace: str, run: str) -> Any:
    return k8s.get(k8s.TRAININGRUNS, namespace, run)["spec"].get("suspend")


class Visitor:
    """A browser's requests to ``address`` (host, port; over TLS with ``tls``) for the
    Host ``host``, keeping the cookies it is given."""

    def __init__(
        self, address: tuple[str, int], host: str, tls: ssl.SSLContext | None = None
    ) -> None:
        self.address, self.host, self.tls = address, host, tls
        self.cookies: dict[str, str] = {}

    def call(
        self, path: str, form: dict[str, str] | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, str, list[str]]:
        """(status, body, the Set-Cookie headers)."""
        connection = (
            http.client.HTTPSConnection(*self.address, context=self.tls, timeout=30)
            if self.tls
            else http.client.HTTPConnection(*self.address, timeout=30)
        )
        sent = {"Host": self.host, **(headers or {})}
        if self.cookies:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        body = urllib.parse.urlencode(form) if form is not None else None
        if body is not None:
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        try:
            connection.request("POST" if form is not None else "GET", path, body, sent)
            response = connection.getresponse()
            text = response.read().decode()
        finally:
            connection.close()
        given = response.headers.get_all("Set-Cookie") or []
        for line in given:
            for name, morsel in http.cookies.SimpleCookie(line).items():
                self.cookies[name] = morsel.value
        return response.status, text, given

    def token(self, path: str) -> str:
        status, page, _ = self.call(path)
        found = re.search(r'name="torchyard-token" content="([^"]+)"', page)
        assert status == 200 and found, (status, page[:300])
        return found[1]

    def sign_in(self, token: str, origin: str) -> list[str]:
        status, text, given = self.call(
            "/login", {"token": self.token("/login"), "k8s_token": token}, {"Origin": origin}
        )
        assert status == 303, (status, text[:300])
        return given


def replicas_share_the_key(a: str, b: str, host: str, token: str, ns: str, run: str) -> None:
    """Signed in on replica ``a`` (a Pod's IP), a page of replica ``b`` suspends the run
    on ``a``: the replicas sign alike."""
    on_a = Visitor((a, 8080), host)
    on_a.sign_in(token, f"http://{host}")
    on_b = Visitor((b, 8080), host)
    on_b.cookies = on_a.cookies
    page = on_b.token(f"/ns/{ns}/runs/{run}")
    status, text, _ = on_a.call(
        f"/ns/{ns}/runs/{run}/suspend", {"token": page}, {"Origin": f"http://{host}"}
    )
    assert status == 303, (status, text[:300])
    assert suspended(ns, run) is True


def behind_the_proxy(proxy: TlsProxy, token: str, ns: str, run: str) -> None:
    """Through the proxy, by its Host: Secure cookies; a foreign Origin changes nothing,
    the view's own origin resumes the run (that ``replicas_share_the_key`` suspended);
    a Host the view does not serve gets 421."""
    caller = Visitor(("127.0.0.1", proxy.port), PUBLIC, proxy.trust)
    status, _, given = caller.call("/login")
    assert status == 200 and given and all("Secure" in c for c in given), given
    signed = caller.sign_in(token, f"https://{PUBLIC}")
    assert len(signed) == 2, signed
    for cookie in signed:
        assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    resume = f"/ns/{ns}/runs/{run}/resume"
    page = caller.token(f"/ns/{ns}/runs/{run}")
    for origin in (f"http://{PUBLIC}", "https://evil.example", "null"):
        status, text, _ = caller.call(resume, {"token": page}, {"Origin": origin})
        assert status == 403 and "changes nothing" in text, (origin, status, text[:300])
    assert suspended(ns, run) is True
    status, text, _ = caller.call(resume, {"token": page}, {"Origin": f"https://{PUBLIC}"})
    assert status == 303, (status, text[:300])
    assert suspended(ns, run) is False
    stranger = Visitor(("127.0.0.1", proxy.port), "evil.test", proxy.trust)
    assert stranger.call("/login")[0] == 421


class TlsProxy:
    """HTTPS on 127.0.0.1 (a certificate of the test's own CA: :attr:`trust`), every
    request passed on to ``upstream`` with its Host and ``X-Forwarded-Proto: https``, as
    an Ingress controller terminating TLS does."""

    def __init__(self, upstream: str, folder: Path) -> None:
        self.upstream = upstream
        pki = make_pki(folder / "proxy-pki", "proxy")
        self.trust = ssl.create_default_context(cafile=str(pki.ca))
        self.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.tls.load_cert_chain(str(pki.cert), str(pki.key))
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TlsProxy:
        self.thread.start()
        assert self.ready.wait(10), "the proxy did not start"
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        self.ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        self.session = ClientSession()
        proxy = web.Application()
        proxy.router.add_route("*", "/{path:.*}", self._forward)
        self.runner = web.AppRunner(proxy, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=self.tls).start()
        self.port = self.runner.addresses[0][1]

    async def _forward(self, request: web.Request) -> web.Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        headers.update({"Host": request.host, "X-Forwarded-Proto": "https"})
        async with self.session.request(
            request.method,
            self.upstream + request.path_qs,
            headers=headers,
            data=await request.read(),
            allow_redirects=False,
        ) as answer:
            body = await answer.read()
            response = web.Response(status=answer.status, body=body)
            for k, v in answer.headers.items():
                if k.lower() not in HOP_BY_HOP:
                    response.headers.add(k, v)
            return response

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        async def stop() -> None:
            await self.session.close()
            await self.runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
