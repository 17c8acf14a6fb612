"""The view as ``torchyard ui`` serves it (``app.start``): over its own TLS listener the
cookies are ``Secure``; what aiohttp itself cannot read (an overlong request line, a
broken header) gets a 400 with the view's security headers that says nothing of what
was sent; it answers the loopback names and refuses any other Host."""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

import aiohttp
import pytest

from tests.unit.registry.test_tls_and_tokens import make_pki
from tests.unit.web.test_csrf import page_token, reviews, source
from torchyard.web import access, app, csrf

ECHOED = b"x" * 9000  # longer than aiohttp's request line limit (8190)


def test_over_its_own_tls_the_view_sets_secure_cookies(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki", "ui")
    trust = ssl.create_default_context(cafile=str(pki.ca))

    async def main() -> None:
        made = app.make_app(source(), namespace="team-a", reviews=reviews())
        runner, url = await app.start(
            made, "127.0.0.1", 0, app.tls_context(str(pki.cert), str(pki.key))
        )
        assert url.startswith("https://127.0.0.1:")
        try:
            jar = aiohttp.CookieJar(unsafe=True)
            async with aiohttp.ClientSession(cookie_jar=jar) as browser:
                async with browser.get(f"{url}/login", ssl=trust) as page:
                    assert "Secure" in page.headers["Set-Cookie"]
                    token = page_token(await page.text())
                async with browser.post(
                    f"{url}/login",
                    data={"token": token, "k8s_token": "alice-token"},
                    headers={"Origin": url},
                    ssl=trust,
                    allow_redirects=False,
                ) as signed:
                    assert signed.status == 303, await signed.text()
                    cookies = {c.split("=", 1)[0]: c for c in signed.headers.getall("Set-Cookie")}
                    for name in (access.COOKIE, csrf.COOKIE):
                        assert "Secure" in cookies[name] and "HttpOnly" in cookies[name]
                with pytest.raises(aiohttp.ClientConnectorCertificateError):
                    await browser.get(f"{url}/login", ssl=ssl.create_default_context())
        finally:
            await runner.cleanup()

    asyncio.run(main())


def raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /" + ECHOED + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-" + ECHOED + b"\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header<script>: x\r\n\r\n",
    ],
    ids=["overlong request line", "overlong header", "broken header"],
)
def test_what_aiohttp_cannot_read_gets_the_security_headers_and_no_echo(
    request_bytes: bytes,
) -> None:
    async def main() -> bytes:
        runner, url = await app.start(app.make_app(source(), namespace="team-a"), "127.0.0.1", 0)
        try:
            port = int(url.rsplit(":", 1)[1])
            return await asyncio.get_running_loop().run_in_executor(None, raw, port, request_bytes)
        finally:
            await runner.cleanup()

    answer = asyncio.run(main())
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0].endswith(b" 400 Bad Request"), answer[:300]
    for header, value in app.HEADERS.items():
        assert f"{header}: {value}".encode() in head, header
    assert b"xxxx" not in answer and b"<script>" not in answer and b"Bad Header" not in answer
    assert body == b"400 Bad Request: the server could not serve this request"


def test_it_answers_the_loopback_names_and_no_other_host() -> None:
    async def main() -> dict[str, int]:
        made = app.make_app(source(), namespace="team-a", hosts=("ui.example.test",))
        runner, url = await app.start(made, "127.0.0.1", 0)
        port = url.rsplit(":", 1)[1]
        got = {}
        try:
            async with aiohttp.ClientSession() as client:
                for host in ("127.0.0.1", "localhost", "[::1]", "ui.example.test", "evil.test"):
                    for path in ("/ns/team-a/runs", "/healthz"):
                        async with client.get(
                            f"{url}{path}", headers={"Host": f"{host}:{port}"}
                        ) as r:
                            got[f"{host} {path}"] = r.status
        finally:
            await runner.cleanup()
        return got

    got = asyncio.run(main())
    assert got == {
        **{f"{h} /ns/team-a/runs": 200 for h in ("127.0.0.1", "localhost", "[::1]")},
        "ui.example.test /ns/team-a/runs": 200,
        "evil.test /ns/team-a/runs": 421,
        **{f"{h} /healthz": 200 for h in ("127.0.0.1", "localhost", "[::1]", "ui.example.test")},
        "evil.test /healthz": 200,
    }
