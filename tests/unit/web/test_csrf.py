"""A change (every POST, ``/login`` included) is done only from the view's own origin and
with the token of the caller's own browser and session: a foreign, ``null``, same-host
other-port or other-scheme ``Origin``, a foreign ``Referer``, a ``Sec-Fetch-Site`` other
than ``same-origin``, another browser's token, the signed-out page's token after signing
in, a token made under another key, or no token cookie at all change nothing. Replicas
sharing a key accept each other's pages. Over HTTP, in-process (the browser and the real
control plane: tests/integration/web/)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import CookieJar
from aiohttp.test_utils import TestClient, TestServer

from tests.unit.web.fakes import FakeSource, run
from torchyard.web import access, app, csrf

Client = TestClient[Any, Any]
USERS = {
    "alice-token": {"username": "system:serviceaccount:team-a:alice", "uid": "a"},
    "mallory-token": {"username": "system:serviceaccount:team-a:mallory", "uid": "m"},
}
SUSPEND = "/ns/team-a/runs/s1/suspend"


def source() -> FakeSource:
    return FakeSource(objects={"team-a": [run("s1")]})


def reviews() -> access.Reviews:
    return access.Reviews(lambda token: USERS.get(token), lambda *asked: True)


def page_token(text: str) -> str:
    found = re.search(r'name="torchyard-token" content="([^"]+)"', text)
    assert found, text[:300]
    return found[1]


async def token_of(client: Client, path: str = "/ns/team-a/runs/s1") -> str:
    return page_token(await (await client.get(path)).text())


def plant(client: Client, name: str, value: str) -> None:
    """Set a cookie in ``client``'s browser as its own server would."""
    client.session.cookie_jar.update_cookies({name: value}, response_url=client.make_url("/"))


def origin(client: Client) -> str:
    return str(client.make_url("/")).rstrip("/")


def serve(
    body: Callable[..., Awaitable[None]],
    *,
    cluster: bool = False,
    clients: int = 1,
    key: bytes | None = None,
    src: FakeSource | None = None,
) -> None:
    """``body(client, ...)``: ``clients`` browsers (each a cookie jar of its own) of one
    view over ``src``; in the cluster (``cluster``) callers sign in."""

    async def main() -> None:
        made = app.make_app(
            src or source(),
            namespace="team-a",
            reviews=reviews() if cluster else None,
            key=key or b"k" * 32,
        )
        server = TestServer(made)
        await server.start_server()
        browsers = [TestClient(server, cookie_jar=CookieJar(unsafe=True)) for _ in range(clients)]
        try:
            for b in browsers:
                await b.start_server()
            await body(*browsers)
        finally:
            for b in browsers:
                await b.close()
            await server.close()

    asyncio.run(main())


def foreign_headers(own: str) -> list[dict[str, str]]:
    host, port = own.rsplit(":", 1)
    other_port = str(int(port) + 1)
    return [
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Origin": f"{host}:{other_port}"},  # same site, another port
        {"Origin": own.replace("http://", "https://")},  # another scheme
        {"Referer": "http://evil.example/page"},
        {"Referer": f"{host}:{other_port}/ns/team-a/runs"},
        {"Origin": own, "Sec-Fetch-Site": "cross-site"},
        {"Origin": own, "Sec-Fetch-Site": "same-site"},
        {"Origin": own, "Sec-Fetch-Site": "none"},
        {"Origin": "http://evil.example:80, " + own},
    ]


def test_a_change_from_another_origin_changes_nothing() -> None:
    src = source()

    async def body(client: Client) -> None:
        token = await token_of(client)
        for headers in foreign_headers(origin(client)):
            refused = await client.post(
                SUSPEND, data={"token": token}, headers=headers, allow_redirects=False
            )
            assert refused.status == 403, (headers, await refused.text())
            assert "changes nothing" in await refused.text()
        assert src.acted == []
        own = origin(client)
        for headers in ({"Origin": own}, {"Referer": f"{own}/ns/team-a/runs/s1"}, {}):
            same = {**headers, "Sec-Fetch-Site": "same-origin"} if headers else headers
            done = await client.post(
                SUSPEND, data={"token": token}, headers=same, allow_redirects=False
            )
            assert done.status == 303, (headers, await done.text())
        assert len(src.acted) == 3

    serve(body, src=src)


def test_the_token_is_bound_to_the_browser_and_its_session() -> None:
    src = source()

    async def body(victim: Client, attacker: Client) -> None:
        await sign_in(victim, "alice-token")
        theirs = await token_of(attacker, "/login")  # (anyone may open /login)
        took = await victim.post(SUSPEND, data={"token": theirs}, allow_redirects=False)
        assert took.status == 403 and "wrong page token" in await took.text()
        # the attacker's id planted in the victim's browser (a page of the same host on
        # another port can set it), with the token made for it: bound to no session of
        # the victim's, refused
        planted = attacker.session.cookie_jar.filter_cookies(attacker.make_url("/"))[csrf.COOKIE]
        plant(victim, csrf.COOKIE, planted.value)
        refused = await victim.post(SUSPEND, data={"token": theirs}, allow_redirects=False)
        assert refused.status == 403
        plant(victim, csrf.COOKIE, "A" * 43)
        guessed = await victim.post(SUSPEND, data={"token": "A" * 43}, allow_redirects=False)
        assert guessed.status == 403
        jar = victim.session.cookie_jar
        signed_in = jar.filter_cookies(victim.make_url("/"))[access.COOKIE].value
        jar.clear()
        plant(victim, access.COOKIE, signed_in)
        bare = await victim.post(SUSPEND, data={"token": theirs}, allow_redirects=False)
        assert bare.status == 403 and "no token cookie" in await bare.text()
        assert src.acted == []
        own = await token_of(victim)
        done = await victim.post(
            SUSPEND, headers={csrf.HEADER: own}, allow_redirects=False
        )  # (a script's POST: the token in the header)
        assert done.status == 303 and src.acted == [("team-a", "runs", "s1", "suspend")]

    serve(body, cluster=True, src=src, clients=2)


async def sign_in(client: Client, k8s_token: str) -> None:
    anonymous = await token_of(client, "/login")
    signed = await client.post(
        "/login", data={"token": anonymous, "k8s_token": k8s_token}, allow_redirects=False
    )
    assert signed.status == 303, await signed.text()


def test_signing_in_binds_the_token_to_the_identity_and_a_login_needs_one_too() -> None:
    src = source()

    async def body(client: Client) -> None:
        anonymous = await token_of(client, "/login")
        for headers in ({"Origin": "http://evil.example"}, {"Origin": "null"}):
            forged = await client.post(
                "/login",
                data={"token": anonymous, "k8s_token": "mallory-token"},
                headers=headers,
                allow_redirects=False,
            )
            assert forged.status == 403 and access.COOKIE not in forged.cookies
        guessed = await client.post(
            "/login", data={"token": "x", "k8s_token": "mallory-token"}, allow_redirects=False
        )
        assert guessed.status == 403 and access.COOKIE not in guessed.cookies
        before = client.session.cookie_jar.filter_cookies(client.make_url("/"))[csrf.COOKIE].value
        signed = await client.post(
            "/login",
            data={"token": anonymous, "k8s_token": "alice-token"},
            headers={"Origin": origin(client)},
            allow_redirects=False,
        )
        assert signed.status == 303, await signed.text()
        after = signed.cookies[csrf.COOKIE].value
        assert after != before  # a new id with the session
        stale = await client.post(SUSPEND, data={"token": anonymous}, allow_redirects=False)
        assert stale.status == 403 and src.acted == []
        fresh = await token_of(client)
        assert fresh != anonymous
        done = await client.post(SUSPEND, data={"token": fresh}, allow_redirects=False)
        assert done.status == 303 and len(src.acted) == 1
        # the cookie of another identity, with the page token of the first: refused
        plant(client, access.COOKIE, "mallory-token")
        other = await client.post(SUSPEND, data={"token": fresh}, allow_redirects=False)
        assert other.status == 403 and len(src.acted) == 1

    serve(body, cluster=True, src=src)


def test_replicas_sharing_a_key_accept_each_others_pages_and_no_other_key_does() -> None:
    async def main() -> None:
        made = {
            name: app.make_app(source(), namespace="team-a", key=key)
            for name, key in (("a", b"1" * 32), ("b", b"1" * 32), ("c", b"2" * 32))
        }
        servers = {name: TestServer(a) for name, a in made.items()}
        for s in servers.values():
            await s.start_server()
        jar = CookieJar(unsafe=True)
        async with TestClient(servers["a"], cookie_jar=jar) as first:
            token = await token_of(first)
            cookie = jar.filter_cookies(first.make_url("/"))[csrf.COOKIE].value
            for name, status in (("b", 303), ("c", 403)):
                async with TestClient(servers[name]) as replica:
                    plant(replica, csrf.COOKIE, cookie)
                    got = await replica.post(SUSPEND, data={"token": token}, allow_redirects=False)
                    assert got.status == status, name
        for s in servers.values():
            await s.close()

    asyncio.run(main())


@pytest.mark.parametrize("path", ["/logout", "/ns/team-a/sweeps/sw/cancel", "/ns/team-a/runs"])
def test_every_post_needs_the_token(path: str) -> None:
    async def body(client: Client) -> None:
        await client.get("/login")
        got = await client.post(path, data={}, allow_redirects=False)
        assert got.status == 403, await got.text()

    serve(body, cluster=True)
