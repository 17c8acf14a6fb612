"""Behind a proxy: only a trusted proxy's ``X-Forwarded-Proto`` and ``X-Forwarded-Host``
are believed, so behind its TLS both cookies are ``Secure``, the Host check and the
origin check use the host and scheme the browser saw, and anyone else's forwarded
headers change nothing. The names the CLI takes are checked (``front``'s parsers)."""

from __future__ import annotations

import asyncio
import ipaddress
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import CookieJar
from aiohttp.test_utils import TestClient, TestServer

from tests.unit.web.test_csrf import page_token, reviews, source
from torchyard.web import access, app, csrf, front

Client = TestClient[Any, Any]
PUBLIC = "ui.example.test"
TLS_PROXY = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": PUBLIC}


def behind(
    proxies: tuple[str, ...], body: Callable[[Client], Awaitable[None]], src: Any = None
) -> None:
    """A view in the cluster answering for :data:`PUBLIC` only, trusting ``proxies``
    (the test client comes from 127.0.0.1)."""

    async def main() -> None:
        made = app.make_app(
            src or source(),
            namespace="team-a",
            hosts=(PUBLIC,),
            reviews=reviews(),
            proxies=[front.network(p) for p in proxies],
        )
        server = TestServer(made)
        await server.start_server()
        # (the browser behind the proxy is on https: it sends Secure cookies back)
        jar = CookieJar(unsafe=True, treat_as_secure_origin=[str(server.make_url(""))])
        async with TestClient(server, cookie_jar=jar) as client:
            await body(client)

    asyncio.run(main())


def set_cookies(response: Any) -> dict[str, str]:
    return {c.split("=", 1)[0]: c for c in response.headers.getall("Set-Cookie", [])}


def test_behind_a_trusted_tls_proxy_the_cookies_are_secure_and_its_origin_is_the_views() -> None:
    src = source()

    async def body(client: Client) -> None:
        page = await client.get("/login", headers=TLS_PROXY)
        assert page.status == 200, await page.text()
        cookie = set_cookies(page)[csrf.COOKIE]
        assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
        token = page_token(await page.text())
        over_http = await client.post(
            "/login",
            data={"token": token, "k8s_token": "alice-token"},
            headers={**TLS_PROXY, "Origin": f"http://{PUBLIC}"},
            allow_redirects=False,
        )
        assert over_http.status == 403  # the browser's origin was https
        bare = await client.post(
            "/login",
            data={"token": token, "k8s_token": "alice-token"},
            headers=TLS_PROXY,
            allow_redirects=False,
        )
        assert bare.status == 403 and "neither Origin nor Referer" in await bare.text()
        signed = await client.post(
            "/login",
            data={"token": token, "k8s_token": "alice-token"},
            headers={**TLS_PROXY, "Origin": f"https://{PUBLIC}"},
            allow_redirects=False,
        )
        assert signed.status == 303, await signed.text()
        cookies = set_cookies(signed)
        for name in (access.COOKIE, csrf.COOKIE):
            assert "Secure" in cookies[name] and "HttpOnly" in cookies[name], cookies
        run = await client.get("/ns/team-a/runs/s1", headers=TLS_PROXY)
        suspended = await client.post(
            "/ns/team-a/runs/s1/suspend",
            data={"token": page_token(await run.text())},
            headers={**TLS_PROXY, "Origin": f"https://{PUBLIC}"},
            allow_redirects=False,
        )
        assert suspended.status == 303 and len(src.acted) == 1

    behind(("127.0.0.0/8",), body, src)


@pytest.mark.parametrize("proxies", [(), ("10.0.0.0/8",), ("::1/128",)])
def test_forwarded_headers_of_an_untrusted_peer_change_nothing(proxies: tuple[str, ...]) -> None:
    async def body(client: Client) -> None:
        refused = await client.get("/login", headers=TLS_PROXY)
        assert refused.status == 421  # its Host (127.0.0.1:port) is not one the view serves
        client.session.cookie_jar.clear()
        served = await client.get("/login", headers={**TLS_PROXY, "Host": PUBLIC})
        assert served.status == 200
        assert "Secure" not in set_cookies(served)[csrf.COOKIE]
        token = page_token(await served.text())
        claimed = await client.post(
            "/login",
            data={"token": token, "k8s_token": "alice-token"},
            headers={**TLS_PROXY, "Host": PUBLIC, "Origin": f"https://{PUBLIC}"},
            allow_redirects=False,
        )
        assert claimed.status == 403  # its scheme is the connection's: http

    behind(proxies, body)


def test_the_nearest_proxys_value_is_the_one_believed() -> None:
    async def body(client: Client) -> None:
        headers = {
            "X-Forwarded-Proto": "https, http",
            "X-Forwarded-Host": f"evil.example, {PUBLIC}",
        }
        page = await client.get("/login", headers=headers)
        assert page.status == 200
        assert "Secure" not in set_cookies(page)[csrf.COOKIE]

    behind(("127.0.0.1/32",), body)


@pytest.mark.parametrize(
    ("value", "name"),
    [("UI.Example.test", "ui.example.test"), ("10.0.0.7", "10.0.0.7"), ("[::1]", "::1")],
)
def test_an_allowed_host_is_a_name_or_an_address(value: str, name: str) -> None:
    assert front.allowed_name(value) == name


@pytest.mark.parametrize(
    "value", ["ui.example.test:443", "https://ui.example.test", "*", "", "a..b", "-a.test", "a/b"]
)
def test_an_allowed_host_with_a_port_or_a_scheme_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="without a port"):
        front.allowed_name(value)


def test_a_trusted_proxy_is_a_network_or_an_address() -> None:
    assert front.network("10.244.0.1") == ipaddress.ip_network("10.244.0.1/32")
    assert front.network("10.244.0.9/24") == ipaddress.ip_network("10.244.0.0/24")
    for bad in ("10.0.0.0/33", "proxy.example", ""):
        with pytest.raises(ValueError):
            front.network(bad)


def test_a_host_header_names_a_host_or_nothing() -> None:
    assert front.host_name("Example.ORG:8080") == "example.org"
    assert front.host_name("[::1]:80") == "::1"
    for bad in ("a:b", "u@example.org", "example.org/x", "", ":80"):
        assert front.host_name(bad) is None, bad
    assert re.fullmatch(front.DNS_NAME, "a-b.c")
