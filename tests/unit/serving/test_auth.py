"""Callers' tokens (torchyard.serving.auth): where a token comes from, what is kept and
for how long (by the token's hash), one question for concurrent requests, and the
registry's answers as the serving Pod reads them (a real HTTP server on loopback)."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
from collections.abc import Iterator

import pytest

from torchyard.serving import auth


def test_the_token_comes_from_bearer_or_the_proxy_header() -> None:
    assert auth.token_of({"authorization": "Bearer abc "}) == "abc"
    assert auth.token_of({"authorization": "bearer abc"}) == "abc"
    assert auth.token_of({"x-torchyard-token": "def"}) == "def"
    assert auth.token_of({"authorization": "Basic xyz"}) == ""


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_answers_are_kept_a_yes_longer_than_a_no_and_never_a_failure() -> None:
    asked: list[str] = []
    answers = {"yes": (200, ""), "no": (403, "nope"), "down": (503, "registry away")}

    def ask(token: str) -> auth.Decision:
        asked.append(token)
        return answers[token]

    clock = Clock()
    access = auth.Access(ask, ttl=30, denied_ttl=5, clock=clock)

    async def scenario() -> None:
        for token in ("yes", "no", "down"):
            assert await access.decide(token) == answers[token]
            assert await access.decide(token) == answers[token]
        assert asked == ["yes", "no", "down", "down"]
        clock.now = 10  # the no expired, the yes not
        await access.decide("yes")
        await access.decide("no")
        assert asked[-1] == "no" and asked.count("yes") == 1
        clock.now = 41
        await access.decide("yes")
        assert asked.count("yes") == 2
        assert await access.decide("") == (
            401,
            "a Kubernetes bearer token for this endpoint is required",
        )
        assert all(len(k) == 64 for k in access._kept)  # hashes, not tokens

    asyncio.run(scenario())


def test_concurrent_requests_with_a_new_token_ask_once() -> None:
    gate = threading.Event()
    asked: list[str] = []

    def ask(token: str) -> auth.Decision:
        asked.append(token)
        gate.wait(5)
        return 200, ""

    access = auth.Access(ask)

    async def scenario() -> list[auth.Decision]:
        calls = [asyncio.create_task(access.decide("t")) for _ in range(5)]
        await asyncio.sleep(0.1)
        gate.set()
        return await asyncio.gather(*calls)

    assert asyncio.run(scenario()) == [(200, "")] * 5
    assert asked == ["t"]


def test_the_cache_is_bounded() -> None:
    access = auth.Access(lambda t: (200, ""), size=3)

    async def scenario() -> None:
        for i in range(10):
            await access.decide(f"t{i}")

    asyncio.run(scenario())
    assert len(access._kept) == 3


@pytest.fixture
def registry() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            token = self.headers.get("Authorization", "")[7:]
            code = {"alice": 200, "mallory": 403}.get(token, 401)
            body = json.dumps({"error": f"{token} said {code}"}).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/namespaces/a/endpoints/birds/access"
    server.shutdown()


def test_the_registrys_answers_as_the_pod_reads_them(registry: str) -> None:
    ask = auth.ask_registry(registry, "")
    assert ask("alice") == (200, "")
    assert ask("mallory") == (403, "mallory said 403")
    assert ask("eve") == (401, "eve said 401")
    code, why = auth.ask_registry("http://127.0.0.1:9/none", "")("alice")
    assert code == 503 and "cannot reach the registry service" in why
